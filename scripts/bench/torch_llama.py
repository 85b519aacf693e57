# The PyTorch peer of scripts/bench/llama-train.ts: transformers' LlamaForCausalLM, or with --experts E
# MixtralForCausalLM (its load-balancing loss in the objective: output_router_logits=True, coefficient
# --aux), f32, eager, SDPA attention, of the same shape; one training step = zero_grad + forward (loss) +
# backward + AdamW (foreach), timed after warm-up on the same token batch shape. Prints one JSON object: median ms per
# step, tokens/s, the process's peak RSS, torch/transformers versions, threads and the allocator
# environment it was started with.
# Usage: torch_llama.py --layers L --heads H --kv-heads K --width C --ffn F --vocab V --ctx T --batch B
#   --steps N --warmup W --threads K [--experts E --top-k K --aux X] [--cpu-time]
import argparse
import json
import os
import resource
import statistics
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    for k, d in [('layers', 4), ('heads', 4), ('kv-heads', 2), ('width', 128), ('ffn', 352), ('vocab', 4096), ('ctx', 128),
                 ('batch', 8), ('steps', 10), ('warmup', 3), ('threads', 2), ('experts', 0), ('top-k', 2)]:
        ap.add_argument('--' + k, type=int, default=d)
    ap.add_argument('--aux', type=float, default=0.01, help='router_aux_loss_coef (with --experts)')
    ap.add_argument('--cpu-time', action='store_true', help='time each step by the process CPU time (use with --threads 1)')
    a = ap.parse_args()
    clock = time.process_time if a.cpu_time else time.perf_counter
    torch.set_num_threads(a.threads)
    import transformers
    torch.manual_seed(0)
    common = dict(vocab_size=a.vocab, hidden_size=a.width, intermediate_size=a.ffn, num_hidden_layers=a.layers, num_attention_heads=a.heads,
                  num_key_value_heads=a.kv_heads, max_position_embeddings=a.ctx, tie_word_embeddings=False, attn_implementation='sdpa')
    if a.experts:
        from transformers import MixtralConfig, MixtralForCausalLM
        # The loss includes router_aux_loss_coef · aux_loss.
        model = MixtralForCausalLM(MixtralConfig(**common, num_local_experts=a.experts, num_experts_per_tok=a.top_k, router_aux_loss_coef=a.aux,
                                                 output_router_logits=True, router_jitter_noise=0.0, sliding_window=None))
    else:
        from transformers import LlamaConfig, LlamaForCausalLM
        model = LlamaForCausalLM(LlamaConfig(**common))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=True)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, a.vocab, (a.batch, a.ctx), generator=g)
    labels = torch.randint(0, a.vocab, (a.batch, a.ctx), generator=g)

    def step():
        opt.zero_grad(set_to_none=True)
        # HF shifts labels inside; passing the targets as labels of a one-longer window is the same work.
        out = model(input_ids=ids, labels=labels)
        out.loss.backward()
        opt.step()
        return out.loss.item()

    for _ in range(a.warmup):
        step()
    times = []
    for _ in range(a.steps):
        t0 = clock()
        step()
        times.append((clock() - t0) * 1000)
    ms = statistics.median(times)
    env = {k: os.environ[k] for k in ('MALLOC_MMAP_MAX_', 'MALLOC_TRIM_THRESHOLD_', 'MALLOC_TOP_PAD_', 'OMP_WAIT_POLICY') if k in os.environ}
    print(json.dumps({
        'impl': 'pytorch-eager', 'torch': torch.__version__, 'transformers': transformers.__version__, 'threads': torch.get_num_threads(), 'clock': 'process CPU time' if a.cpu_time else 'wall',
        'allocatorEnv': env, 'msPerStep': ms, 'tokensPerSec': a.batch * a.ctx / (ms / 1000),
        'peakRssMiB': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 'params': sum(p.numel() for p in model.parameters()),
    }))


if __name__ == '__main__':
    main()
