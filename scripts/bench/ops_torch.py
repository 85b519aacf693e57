# PyTorch peer of `nodetron bench ops`: the same ops, shapes and timing rule (median of rounds,
# forward + backward), printed as JSON {case: seconds}. Used only for side-by-side benchmarks.
import json, sys, time
import torch
import torch.nn.functional as F

torch.manual_seed(0)
threads = int(sys.argv[1]) if len(sys.argv) > 1 else torch.get_num_threads()
torch.set_num_threads(threads)

def time_it(fn, min_seconds=0.3, rounds=5):
    fn()
    calls = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(calls): fn()
        dt = time.perf_counter() - t0
        if dt * rounds >= min_seconds: break
        calls *= max(2, min(10, int(min_seconds / rounds / max(dt, 1e-9)) + 1))
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls): fn()
        per.append((time.perf_counter() - t0) / calls)
    per.sort()
    return per[len(per) // 2]

N, V, C, B, H, T, D = 1024, 50257, 128, 8, 4, 128, 32
out = {}

logits = torch.randn(N, V, requires_grad=True)
targets = torch.randint(0, V, (N,))
def ce():
    logits.grad = None
    F.cross_entropy(logits, targets).backward()
out['crossEntropy fwd+bwd [1024, 50257]'] = time_it(ce)

x = torch.randn(N, C, requires_grad=True)
w = torch.randn(V, C, requires_grad=True)
def lin():
    x.grad = None; w.grad = None
    y = F.linear(x, w)
    y.backward(torch.ones_like(y))
out['linear fwd+bwd [1024,128]x[50257,128]'] = time_it(lin, rounds=3)

def lm_head():
    x.grad = None; w.grad = None
    F.cross_entropy(F.linear(x, w), targets).backward()
out['linear+crossEntropy fwd+bwd (LM head)'] = time_it(lm_head, rounds=3)

q, k, v = (torch.randn(B, H, T, D, requires_grad=True) for _ in range(3))
def att():
    for t in (q, k, v): t.grad = None
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    o.backward(torch.ones_like(o))
out['attention fwd+bwd [8,4,128,32] causal'] = time_it(att)

xl = torch.randn(N, C, requires_grad=True); wl = torch.ones(C, requires_grad=True); bl = torch.zeros(C, requires_grad=True)
def ln():
    for t in (xl, wl, bl): t.grad = None
    y = F.layer_norm(xl, (C,), wl, bl)
    y.backward(torch.ones_like(y))
out['layerNorm fwd+bwd [1024,128]'] = time_it(ln)

xg = torch.randn(N, 4 * C, requires_grad=True)
def ge():
    xg.grad = None
    y = F.gelu(xg, approximate='tanh')
    y.backward(torch.ones_like(y))
out['gelu fwd+bwd [1024,512]'] = time_it(ge)

print(json.dumps({'torch': torch.__version__, 'threads': threads, 'seconds': out}))
