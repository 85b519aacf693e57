#!/usr/bin/env python3
# PyTorch eager peer of scripts/bench/moe.ts: the same small MoE GPT (learned positions, pre-LayerNorm
# blocks without biases, causal attention, tied head; every block's MLP an MoE of 8 SwiGLU experts, top-2,
# probabilities renormalized, a loop over the experts on the rows routed to each, Switch load-balancing
# loss 0.01 and router z-loss 0.001), AdamW, the same token batches; prints one JSON line like moe.ts.
# Run with glibc kept warm, as the other torch peers (lib/bench/util.ts):
#   MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=1073741824 python3 scripts/bench/moe_torch.py [--threads 1 --cpu-time]
import argparse, json, os, resource, statistics, time
import torch
import torch.nn as nn
import torch.nn.functional as F

p = argparse.ArgumentParser()
for k, v in dict(steps=12, warmup=3, batch=8, ctx=64, width=128, layers=2, experts=8, top_k=2, threads=0).items():
    p.add_argument('--' + k.replace('_', '-'), type=int, default=v)
p.add_argument('--cpu-time', action='store_true', help='time each step by the process CPU time (use with --threads 1)')
a = p.parse_args()
clock = time.process_time if a.cpu_time else time.perf_counter
if a.threads: torch.set_num_threads(a.threads)
torch.manual_seed(1)
V, C, E, K, H = 2048, a.width, a.experts, a.top_k, 2 * a.width

class MoE(nn.Module):
    def __init__(self):
        super().__init__()
        self.router = nn.Linear(C, E, bias=False)
        self.gate = nn.ParameterList([nn.Parameter(torch.randn(H, C) * 0.02) for _ in range(E)])
        self.up = nn.ParameterList([nn.Parameter(torch.randn(H, C) * 0.02) for _ in range(E)])
        self.down = nn.ParameterList([nn.Parameter(torch.randn(C, H) * 0.02) for _ in range(E)])
    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, C)
        n = x.shape[0]
        logits = self.router(x)
        probs = logits.softmax(-1)
        w, idx = probs.topk(K, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        flat = idx.reshape(-1)
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=E).tolist()
        rows = x[order // K]
        outs, at = [], 0
        for e in range(E):
            r = rows[at:at + counts[e]]
            at += counts[e]
            outs.append(F.linear(F.silu(F.linear(r, self.gate[e])) * F.linear(r, self.up[e]), self.down[e]))
        ys = torch.cat(outs)
        out = torch.zeros(n * K, C, dtype=x.dtype).index_copy(0, order, ys).reshape(n, K, C)
        out = (out * w.unsqueeze(-1)).sum(1)
        f = torch.tensor(counts, dtype=x.dtype) / (n * K)
        lb = E * (f * probs.mean(0)).sum()
        z = torch.logsumexp(logits, -1).pow(2).mean()
        return out.reshape(shape), 0.01 * lb + 0.001 * z

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(C, bias=False), nn.LayerNorm(C, bias=False)
        self.qkv, self.proj = nn.Linear(C, 3 * C, bias=False), nn.Linear(C, C, bias=False)
        self.moe = MoE()
    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (z.view(b, t, 4, C // 4).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, C)
        x = x + self.proj(y)
        m, aux = self.moe(self.ln2(x))
        return x + m, aux

class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(a.ctx, C)
        self.h = nn.ModuleList([Block() for _ in range(a.layers)])
        self.lnf = nn.LayerNorm(C, bias=False)
    def forward(self, idx, tgt):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        aux = 0
        for blk in self.h:
            x, a_ = blk(x)
            aux = aux + a_
        logits = F.linear(self.lnf(x), self.wte.weight)
        return F.cross_entropy(logits.view(-1, V), tgt.view(-1)) + aux

def tokens(step):
    s = (step + 1) * 7919
    seq = []
    for _ in range(a.batch * (a.ctx + 1)):
        s = (s * 1103515245 + 12345) % 2147483648
        seq.append(s % V)
    t = torch.tensor(seq).view(a.batch, a.ctx + 1)
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()

model = GPT()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0)
times = []
for i in range(a.warmup + a.steps):
    x, y = tokens(i)
    t0 = clock()
    loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    if i >= a.warmup: times.append((clock() - t0) * 1000)
ms = statistics.median(times)
print(json.dumps({'impl': 'torch eager', 'torch': torch.__version__, 'threads': torch.get_num_threads(), 'clock': 'process CPU time' if a.cpu_time else 'wall', 'experts': E, 'topK': K, 'width': C,
                  'batch': a.batch, 'ctx': a.ctx, 'stepMs': round(ms, 1), 'tokensPerSec': round(a.batch * a.ctx / (ms / 1000)),
                  'maxRssMiB': round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1), 'load1': round(os.getloadavg()[0], 2)}))
