# Golden files for nodetron's mixture-of-experts Llamas with Hugging Face transformers (Mixtral and
# Qwen2-MoE in lib/interop/hf-llama.ts), written into test/golden/moe/:
#   mixtral/          a tiny seeded MixtralForCausalLM (2 layers, 4 heads, 2 key/value heads, hidden 32,
#                     4 experts of 16 hidden units, top-2, vocab 64, rope_theta 500, untied head) saved by
#                     save_pretrained in f32 and sharded (model-0000i-of-0000n.safetensors + index)
#   mixtral-bf16/     the same model in bf16, one model.safetensors
#   qwen2-moe/        a tiny Qwen2MoeForCausalLM (3 layers, block 1 dense by mlp_only_layers, 4 experts of
#                     16, top-2 not renormalized, a shared expert of 24 behind its sigmoid gate, q/k/v
#                     biases, dense MLP 40), f32
#   qwen2-moe-step2/  Qwen2-MoE with decoder_sparse_step 2 (block 0 dense, block 1 MoE), top-2
#                     renormalized, multi-query, tied head, bf16
#   logits.json       each model's logits for a fixed batch of tokens (the bf16 models' computed in f32
#                     from their bf16 weights)
# Run: python3 scripts/golden/moe.py            (needs torch, transformers, safetensors; the tests that
#                                                read these files do not)
# Check that a directory nodetron exported loads in transformers and gives the golden logits:
#   npx tsx scripts/golden/moe-export.ts /tmp/nt-mixtral --from mixtral [--dtype bf16] [--shard-bytes 20000]
#   python3 scripts/golden/moe.py --verify /tmp/nt-mixtral --reference mixtral
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_golden  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, '..', '..', 'test', 'golden', 'moe')
SEED = 20251126
COMMON = dict(vocab_size=64, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
              rope_theta=500.0, rms_norm_eps=1e-5, tie_word_embeddings=False, initializer_range=0.2, num_experts_per_tok=2,
              router_aux_loss_coef=0.02)
MIXTRAL = dict(COMMON, num_hidden_layers=2, intermediate_size=16, num_local_experts=4, router_jitter_noise=0.0, sliding_window=None)
QWEN = dict(COMMON, num_hidden_layers=3, intermediate_size=40, moe_intermediate_size=16, shared_expert_intermediate_size=24,
            num_experts=4, decoder_sparse_step=1, mlp_only_layers=[1], norm_topk_prob=False, use_sliding_window=False)
QWEN_STEP2 = dict(QWEN, num_hidden_layers=2, decoder_sparse_step=2, mlp_only_layers=[], norm_topk_prob=True, num_key_value_heads=1,
                  tie_word_embeddings=True)
MODELS = {
    'mixtral': dict(kind='mixtral', config=MIXTRAL, dtype=torch.float32, shard='20KB'),
    'mixtral-bf16': dict(kind='mixtral', config=MIXTRAL, dtype=torch.bfloat16, shard=None),
    'qwen2-moe': dict(kind='qwen2_moe', config=QWEN, dtype=torch.float32, shard=None),
    'qwen2-moe-step2': dict(kind='qwen2_moe', config=QWEN_STEP2, dtype=torch.bfloat16, shard=None),
}


def classes(kind):
    if kind == 'mixtral':
        from transformers import MixtralConfig, MixtralForCausalLM
        return MixtralConfig, MixtralForCausalLM
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM
    return Qwen2MoeConfig, Qwen2MoeForCausalLM


def build(spec):
    config_class, model_class = classes(spec['kind'])
    torch.manual_seed(SEED)
    model = model_class(config_class(**spec['config']))
    # HF initializes RMSNorm scales to 1 and biases to 0; perturb them so the tests see each one used.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if 'norm' in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith('.bias'):
                p.copy_(0.3 * torch.randn_like(p))
    return model.eval()


def write():
    hf_golden.write(OUT, MODELS, build, COMMON['vocab_size'], keep_generation_config=False)


if __name__ == '__main__':
    hf_golden.main(OUT, write, 'mixtral', 'one of the golden models')
