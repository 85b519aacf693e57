# Golden files for nodetron's Llama interop with Hugging Face transformers (lib/interop/hf-llama.ts),
# written into test/golden/llama/:
#   hf-tiny/        a tiny seeded LlamaForCausalLM (2 layers, 4 heads, 2 key/value heads, hidden 32,
#                   intermediate 48, vocab 64, rope_theta 500, untied head) saved by save_pretrained in
#                   f32 and sharded (model-0000i-of-0000n.safetensors + model.safetensors.index.json)
#   hf-tiny-bf16/   the same model in bf16, one model.safetensors
#   hf-tied/        a tied, multi-query variant (1 key/value head), f32
#   logits.json     each model's logits for a fixed batch of tokens (the bf16 model's computed in f32
#                   from its bf16 weights)
# Run: python3 scripts/golden/llama.py          (needs torch, transformers, safetensors; the tests that
#                                                read these files do not)
# Check that a directory nodetron exported loads in transformers and gives the golden logits:
#   npx tsx scripts/golden/llama-export.ts /tmp/nt-llama [--dtype bf16] [--shard-bytes 20000]
#   python3 scripts/golden/llama.py --verify /tmp/nt-llama
import argparse
import base64
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, '..', '..', 'test', 'golden', 'llama')
SEED = 20251126
BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=16, rope_theta=500.0, rms_norm_eps=1e-5,
            tie_word_embeddings=False, initializer_range=0.2, attention_bias=False, mlp_bias=False)
MODELS = {
    'hf-tiny': dict(config=BASE, dtype=torch.float32, shard='20KB'),
    'hf-tiny-bf16': dict(config=BASE, dtype=torch.bfloat16, shard=None),
    'hf-tied': dict(config={**BASE, 'num_key_value_heads': 1, 'tie_word_embeddings': True}, dtype=torch.float32, shard=None),
}
BATCH, SEQ = 2, 16


def b64(t):
    return base64.b64encode(t.detach().contiguous().to(torch.float32).numpy().astype('<f4').tobytes()).decode()


def tokens():
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, BASE['vocab_size'], (BATCH, SEQ), generator=g)


def build(config):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(LlamaConfig(**config))
    # HF initializes RMSNorm scales to 1; perturb them so the tests see each one used.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if 'norm' in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    return model.eval()


def logits_of(model, ids):
    with torch.no_grad():
        return model(ids).logits.float()


def write():
    os.makedirs(OUT, exist_ok=True)
    ids = tokens()
    out = {'batch': BATCH, 'seq': SEQ, 'tokens': ids.flatten().tolist(), 'models': {}}
    for name, spec in MODELS.items():
        model = build(spec['config'])
        if spec['dtype'] != torch.float32:
            # The bf16 weights, computed in f32. Only the parameters are rounded: model.to(bf16) would
            # round the rotary inv_freq buffer too, which from_pretrained recomputes in f32.
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(p.to(spec['dtype']).float())
        logits = logits_of(model, ids)
        save = model.to(spec['dtype'])
        kw = {'safe_serialization': True}
        if spec['shard']:
            kw['max_shard_size'] = spec['shard']
        save.save_pretrained(os.path.join(OUT, name), **kw)
        out['models'][name] = {'logits': b64(logits), 'shape': list(logits.shape)}
        print(name, list(logits.shape), os.listdir(os.path.join(OUT, name)))
    with open(os.path.join(OUT, 'logits.json'), 'w') as f:
        json.dump(out, f)
        f.write('\n')


def verify(path, reference):
    """Loads an export with transformers and compares its logits with the golden model's."""
    from transformers import LlamaForCausalLM
    with open(os.path.join(OUT, 'logits.json')) as f:
        golden = json.load(f)
    ids = torch.tensor(golden['tokens']).view(golden['batch'], golden['seq'])
    model = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    got = logits_of(model, ids)
    want = torch.frombuffer(bytearray(base64.b64decode(golden['models'][reference]['logits'])), dtype=torch.float32).view(got.shape)
    err = (got - want).abs().max().item()
    scale = want.abs().max().item()
    print(f'{path}: max |logits - golden {reference}| = {err:.3g} (logits up to {scale:.3g})')
    return err <= 1e-4 * max(1.0, scale)


if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('--verify', help='a directory nodetron exported (from the hf-tiny golden model)')
    ap.add_argument('--reference', default='hf-tiny', help='which golden model the export came from')
    a = ap.parse_args()
    if a.verify:
        sys.exit(0 if verify(a.verify, a.reference) else 1)
    write()
