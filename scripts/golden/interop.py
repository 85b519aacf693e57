# Golden files for nodetron's interop with Hugging Face transformers and llm.c (lib/interop/), written
# into test/golden/interop/:
#   hf-tiny/          a tiny seeded GPT-2 (2 layers, 2 heads, n_embd 32, vocab 64, 16 positions) saved by
#                     GPT2LMHeadModel.save_pretrained(safe_serialization=True)
#   gpt2-tiny.bin     the same weights as an llm.c model file, fp32 (version 3), vocabulary padded to 128
#   gpt2-tiny_bf16.bin  the same in bf16 (version 5)
#   logits.json       the HF model's logits for a fixed batch of tokens
# The llm.c files follow llm.c's train_gpt2.py (write_model, write_tensors, pad_vocab): its GPT holds
# nn.Linear weights, so the Conv1D weights of the HF model are transposed first, as its from_pretrained does.
#
# Run: python3 scripts/golden/interop.py            (needs torch, transformers, safetensors; the tests
#                                                     that read these files do not)
# Check by hand that a directory nodetron exported loads in transformers and gives nodetron's logits:
#   npx tsx scripts/golden/interop-export.ts /tmp/nt-hf [--dtype bf16]
#   python3 scripts/golden/interop.py --verify /tmp/nt-hf
import argparse
import base64
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, '..', '..', 'test', 'golden', 'interop')
SEED = 20240326
CONFIG = dict(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=16)
BATCH, SEQ = 2, 16
LLMC_MAGIC = 20240326
CONV1D = ('attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight')


def b64(t):
    return base64.b64encode(t.detach().contiguous().to(torch.float32).numpy().astype('<f4').tobytes()).decode()


def build():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(SEED)
    model = GPT2LMHeadModel(GPT2Config(**CONFIG))
    # HF initializes LayerNorms to (1, 0) and biases to 0; perturb them so the tests see each one used.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if 'ln_' in name and name.endswith('.weight'):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith('.bias'):
                p.copy_((0.1 if 'ln_' in name else 0.02) * torch.randn_like(p))
    return model.eval()


def llmc_params(model):
    """llm.c's train_gpt2.py GPT state: transformer.* names, Linear [out, in] weights (the HF Conv1D ones transposed)."""
    params = {}
    for k, v in model.state_dict().items():
        if not k.startswith('transformer.') or k.endswith('.attn.bias') or k.endswith('.attn.masked_bias'):
            continue
        params[k] = v.t().contiguous() if k.endswith(CONV1D) else v
    return params


def pad_vocab(tensor, multiple=128):
    # llm.c's pad_vocab, without its assertion that V is GPT-2's 50257.
    v, c = tensor.shape
    vp = ((v + multiple - 1) // multiple) * multiple
    return torch.nn.functional.pad(tensor, (0, 0, 0, vp - v), value=0) if vp > v else tensor


def write_llmc(params, config, filename, dtype):
    # llm.c's write_model and write_tensors.
    version = {'float32': 3, 'bfloat16': 5}[dtype]
    header = torch.zeros(256, dtype=torch.int32)
    header[0] = LLMC_MAGIC
    header[1] = version
    header[2] = config['n_positions']
    header[3] = config['vocab_size']
    header[4] = config['n_layer']
    header[5] = config['n_head']
    header[6] = config['n_embd']
    params = dict(params)
    params['transformer.wte.weight'] = pad_vocab(params['transformer.wte.weight'])
    header[7] = params['transformer.wte.weight'].size(0)

    def write(t, f):
        if dtype == 'float32':
            f.write(t.detach().cpu().to(torch.float32).numpy().tobytes())
        else:
            f.write(t.detach().cpu().to(torch.bfloat16).view(torch.int16).numpy().tobytes())

    L = config['n_layer']
    with open(filename, 'wb') as f:
        f.write(header.numpy().tobytes())
        write(params['transformer.wte.weight'], f)
        write(params['transformer.wpe.weight'], f)
        for suffix in ('ln_1.weight', 'ln_1.bias', 'attn.c_attn.weight', 'attn.c_attn.bias', 'attn.c_proj.weight', 'attn.c_proj.bias',
                       'ln_2.weight', 'ln_2.bias', 'mlp.c_fc.weight', 'mlp.c_fc.bias', 'mlp.c_proj.weight', 'mlp.c_proj.bias'):
            for i in range(L):
                write(params[f'transformer.h.{i}.{suffix}'], f)
        write(params['transformer.ln_f.weight'], f)
        write(params['transformer.ln_f.bias'], f)


def generate():
    import transformers
    model = build()
    os.makedirs(OUT, exist_ok=True)
    hf_dir = os.path.join(OUT, 'hf-tiny')
    model.save_pretrained(hf_dir, safe_serialization=True)
    params = llmc_params(model)
    write_llmc(params, CONFIG, os.path.join(OUT, 'gpt2-tiny.bin'), 'float32')
    write_llmc(params, CONFIG, os.path.join(OUT, 'gpt2-tiny_bf16.bin'), 'bfloat16')
    gen = torch.Generator().manual_seed(SEED)
    idx = torch.randint(0, CONFIG['vocab_size'], (BATCH, SEQ), generator=gen)
    with torch.no_grad():
        logits = model(idx).logits
    with open(os.path.join(OUT, 'logits.json'), 'w') as f:
        json.dump({
            'config': CONFIG, 'batch': BATCH, 'seq': SEQ, 'idx': idx.flatten().tolist(), 'logits': b64(logits),
            'versions': {'torch': torch.__version__, 'transformers': transformers.__version__},
        }, f, indent=1)
        f.write('\n')
    print(f'wrote {OUT}: hf-tiny/, gpt2-tiny.bin, gpt2-tiny_bf16.bin, logits.json')


def verify(d):
    """Loads a nodetron export with from_pretrained (nothing missing, unexpected or misshaped; head tied) and compares its logits with nodetron's."""
    from safetensors import safe_open
    from transformers import GPT2LMHeadModel
    model, info = GPT2LMHeadModel.from_pretrained(d, output_loading_info=True, dtype=torch.float32)
    model.eval()
    problems = {k: v for k, v in info.items() if v}
    if problems:
        sys.exit(f'from_pretrained({d}) reported {problems}')
    if model.lm_head.weight.data_ptr() != model.transformer.wte.weight.data_ptr():
        sys.exit('the LM head is not tied to transformer.wte.weight')
    # Every tensor in the file is one the model holds, at the saved shape.
    sd = model.state_dict()
    with safe_open(os.path.join(d, 'model.safetensors'), 'pt') as f:
        names = list(f.keys())
        dtypes = sorted({f.get_slice(k).get_dtype() for k in names})
        for k in names:
            if k not in sd or list(sd[k].shape) != f.get_slice(k).get_shape():
                sys.exit(f'{k} does not match the model ({f.get_slice(k).get_shape()})')
            if not torch.equal(sd[k], f.get_tensor(k).to(torch.float32)):
                sys.exit(f'{k} was not loaded as saved')
    with open(os.path.join(d, 'nodetron_logits.json')) as f:
        ref = json.load(f)
    idx = torch.tensor(ref['idx'], dtype=torch.long).view(ref['batch'], ref['seq'])
    want = torch.frombuffer(bytearray(base64.b64decode(ref['logits'])), dtype=torch.float32).view(ref['batch'], ref['seq'], -1)
    with torch.no_grad():
        got = model(idx).logits
    err = (got - want).abs().max().item()
    rel = err / want.abs().max().item()
    print(f'{d}: {len(names)} tensors ({", ".join(dtypes)}), config {model.config.n_layer} layers / {model.config.n_head} heads / '
          f'n_embd {model.config.n_embd} / vocab {model.config.vocab_size} / {model.config.n_positions} positions; '
          f'logits of {tuple(got.shape)}: max |HF - nodetron| = {err:.3g} ({rel:.3g} of the largest logit)')
    if rel > 1e-4:
        sys.exit('the logits differ')
    print('OK: GPT2LMHeadModel.from_pretrained loads the export and computes nodetron\'s logits')


if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('--verify', metavar='DIR', help='check a directory written by nodetron.interop.exportHF (with nodetron_logits.json beside it)')
    args = ap.parse_args()
    verify(args.verify) if args.verify else generate()
