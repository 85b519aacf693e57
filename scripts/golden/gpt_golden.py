# Golden values for nodetron's GPT from PyTorch: weights, inputs, logits, loss, every parameter gradient,
# and losses/parameters over 3 AdamW steps. Writes test/golden/gpt_small.json (f32 arrays as base64).
# Run: python3 scripts/golden/gpt_golden.py   (needs torch; the tests that read the file do not)
import base64
import json
import math
import os

import torch
import torch.nn.functional as F

SEED = 1234
CONFIG = dict(vocabSize=64, blockSize=16, nLayer=2, nHead=2, nEmbd=32, dropout=0.0, bias=True)
BATCH, SEQ = 2, 16
ADAMW = dict(lr=1e-2, betas=[0.9, 0.95], eps=1e-8, weightDecay=0.1, steps=3)
# GPT-2's GELU is the tanh approximation.
GELU_APPROX = 'tanh'


def b64(t):
    return base64.b64encode(t.detach().contiguous().to(torch.float32).numpy().astype('<f4').tobytes()).decode()


def make_params(cfg, gen):
    """Parameters named as nodetron names them, initialized as GPT-2 (N(0, 0.02), residual projections scaled)."""
    c, v, L = cfg['nEmbd'], cfg['vocabSize'], cfg['nLayer']
    ps = {}
    normal = lambda *shape, std=0.02: torch.randn(*shape, generator=gen) * std
    ps['wte.weight'] = normal(v, c)
    ps['wpe.weight'] = normal(cfg['blockSize'], c)
    for i in range(L):
        p = f'h.{i}.'
        # LayerNorm scale/shift perturbed from (1, 0) so the test sees them used.
        ps[p + 'ln1.weight'] = 1 + normal(c, std=0.1)
        ps[p + 'ln1.bias'] = normal(c, std=0.1)
        ps[p + 'attn.qkv.weight'] = normal(3 * c, c)
        ps[p + 'attn.qkv.bias'] = normal(3 * c)
        ps[p + 'attn.proj.weight'] = normal(c, c, std=0.02 / math.sqrt(2 * L))
        ps[p + 'attn.proj.bias'] = normal(c)
        if not cfg.get('parallelBlock'):
            ps[p + 'ln2.weight'] = 1 + normal(c, std=0.1)
            ps[p + 'ln2.bias'] = normal(c, std=0.1)
        ps[p + 'mlp.fc.weight'] = normal(4 * c, c)
        ps[p + 'mlp.fc.bias'] = normal(4 * c)
        ps[p + 'mlp.proj.weight'] = normal(c, 4 * c, std=0.02 / math.sqrt(2 * L))
        ps[p + 'mlp.proj.bias'] = normal(c)
    ps['lnF.weight'] = 1 + normal(c, std=0.1)
    ps['lnF.bias'] = normal(c, std=0.1)
    return {k: t.double().requires_grad_(True) for k, t in ps.items()}


def attention(q, k, v, window, fused=False):
    if fused and window is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    t = q.shape[-2]
    i = torch.arange(t)[:, None]
    j = torch.arange(t)[None, :]
    allowed = j <= i
    if window is not None:
        allowed = allowed & (i - j < window)
    att = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    att = att.masked_fill(~allowed, float('-inf'))
    return torch.softmax(att, dim=-1) @ v


def forward(ps, cfg, idx, targets, fused_attention=False):
    b, t = idx.shape
    c, nh = cfg['nEmbd'], cfg['nHead']
    ln = lambda x, name: F.layer_norm(x, (c,), ps[name + '.weight'], ps[name + '.bias'], 1e-5)
    lin = lambda x, name: F.linear(x, ps[name + '.weight'], ps[name + '.bias'])
    x = ps['wte.weight'][idx] + ps['wpe.weight'][torch.arange(t)]
    for i in range(cfg['nLayer']):
        p = f'h.{i}.'

        def attn(h):
            qkv = lin(h, p + 'attn.qkv').view(b, t, 3, nh, c // nh).permute(2, 0, 3, 1, 4)
            y = attention(qkv[0], qkv[1], qkv[2], cfg.get('window'), fused_attention)
            return lin(y.transpose(1, 2).reshape(b, t, c), p + 'attn.proj')

        mlp = lambda h: lin(F.gelu(lin(h, p + 'mlp.fc'), approximate=GELU_APPROX), p + 'mlp.proj')
        if cfg.get('parallelBlock'):
            h = ln(x, p + 'ln1')
            x = x + attn(h) + mlp(h)
        else:
            x = x + attn(ln(x, p + 'ln1'))
            x = x + mlp(ln(x, p + 'ln2'))
    logits = F.linear(ln(x, 'lnF'), ps['wte.weight'])
    loss = F.cross_entropy(logits.view(-1, cfg['vocabSize']), targets.view(-1))
    return logits, loss


def case(cfg, gen, adam_steps):
    ps = make_params(cfg, gen)
    idx = torch.randint(0, cfg['vocabSize'], (BATCH, SEQ), generator=gen)
    targets = torch.randint(0, cfg['vocabSize'], (BATCH, SEQ), generator=gen)
    out = {
        'config': cfg,
        'batch': BATCH, 'seq': SEQ,
        'idx': idx.flatten().tolist(), 'targets': targets.flatten().tolist(),
        'params': {k: {'shape': list(v.shape), 'data': b64(v)} for k, v in ps.items()},
    }
    logits, loss = forward(ps, cfg, idx, targets)
    loss.backward()
    out['logits'] = b64(logits)
    out['loss'] = loss.item()
    out['grads'] = {k: b64(v.grad) for k, v in ps.items()}
    if adam_steps:
        # AdamW in float64 from the same start: losses before each step, then the final parameters.
        for v in ps.values():
            v.grad = None
        opt = torch.optim.AdamW(list(ps.values()), lr=ADAMW['lr'], betas=tuple(ADAMW['betas']), eps=ADAMW['eps'],
                                weight_decay=ADAMW['weightDecay'])
        losses = []
        for _ in range(ADAMW['steps']):
            opt.zero_grad()
            _, l = forward(ps, cfg, idx, targets)
            l.backward()
            losses.append(l.item())
            opt.step()
        _, l = forward(ps, cfg, idx, targets)
        losses.append(l.item())
        out['adamw'] = {**ADAMW, 'losses': losses, 'params': {k: b64(v) for k, v in ps.items()}}
    return out


def main():
    gen = torch.Generator().manual_seed(SEED)
    data = {
        'generator': 'scripts/golden/gpt_golden.py', 'torch': torch.__version__, 'seed': SEED, 'gelu': GELU_APPROX,
        'standard': case(CONFIG, gen, True),
        'parallelWindow': case({**CONFIG, 'parallelBlock': True, 'window': 5}, gen, False),
    }
    path = os.path.join(os.path.dirname(__file__), '..', '..', 'test', 'golden', 'gpt_small.json')
    with open(path, 'w') as f:
        json.dump(data, f)
    print(f'wrote {os.path.normpath(path)} ({os.path.getsize(path)} bytes), loss {data["standard"]["loss"]:.6f}')


if __name__ == '__main__':
    torch.set_default_dtype(torch.float64)
    main()
