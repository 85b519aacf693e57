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
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_golden  # noqa: E402

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


def build(spec):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(LlamaConfig(**spec['config']))
    # HF initializes RMSNorm scales to 1; perturb them so the tests see each one used.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if 'norm' in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    return model.eval()


def write():
    hf_golden.write(OUT, MODELS, build, BASE['vocab_size'])


if __name__ == '__main__':
    hf_golden.main(OUT, write, 'hf-tiny', 'the hf-tiny golden model')
