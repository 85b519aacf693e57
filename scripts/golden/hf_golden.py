# What the Hugging Face golden scripts (llama.py, moe.py) share: tokens, logits as base64 f32, writing
# each seeded model with save_pretrained beside a logits.json, and the --verify check that loads a
# directory nodetron exported with transformers and compares its logits with a golden model's.
import argparse
import base64
import json
import os
import sys

import torch

BATCH, SEQ = 2, 16


def b64(t):
    return base64.b64encode(t.detach().contiguous().to(torch.float32).numpy().astype('<f4').tobytes()).decode()


def tokens(vocab_size):
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, vocab_size, (BATCH, SEQ), generator=g)


def logits_of(model, ids):
    with torch.no_grad():
        return model(ids).logits.float()


def write(out_dir, models, build, vocab_size, keep_generation_config=True):
    """Saves each model of `models` (name -> spec with 'dtype' and 'shard'; build(spec) makes it) in
    out_dir/name and every model's logits for the same tokens in out_dir/logits.json. A 16-bit model's
    logits are computed in f32 from its rounded weights (the parameters only: model.to(bf16) would round
    the rotary inv_freq buffer too, which from_pretrained recomputes in f32)."""
    os.makedirs(out_dir, exist_ok=True)
    ids = tokens(vocab_size)
    out = {'batch': BATCH, 'seq': SEQ, 'tokens': ids.flatten().tolist(), 'models': {}}
    for name, spec in models.items():
        model = build(spec)
        if spec['dtype'] != torch.float32:
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(p.to(spec['dtype']).float())
        logits = logits_of(model, ids)
        save = model.to(spec['dtype'])
        kw = {'safe_serialization': True}
        if spec['shard']:
            kw['max_shard_size'] = spec['shard']
        save.save_pretrained(os.path.join(out_dir, name), **kw)
        gen = os.path.join(out_dir, name, 'generation_config.json')
        if not keep_generation_config and os.path.exists(gen):
            os.remove(gen)
        out['models'][name] = {'logits': b64(logits), 'shape': list(logits.shape)}
        print(name, list(logits.shape), sorted(os.listdir(os.path.join(out_dir, name))))
    with open(os.path.join(out_dir, 'logits.json'), 'w') as f:
        json.dump(out, f)
        f.write('\n')


def verify(out_dir, path, reference):
    """Loads an export with transformers (AutoModelForCausalLM: the class its config.json names) and compares its logits with the golden model's."""
    from transformers import AutoModelForCausalLM
    with open(os.path.join(out_dir, 'logits.json')) as f:
        golden = json.load(f)
    ids = torch.tensor(golden['tokens']).view(golden['batch'], golden['seq'])
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    got = logits_of(model, ids)
    want = torch.frombuffer(bytearray(base64.b64decode(golden['models'][reference]['logits'])), dtype=torch.float32).view(got.shape)
    err = (got - want).abs().max().item()
    scale = want.abs().max().item()
    print(f'{path}: {type(model).__name__}: max |logits - golden {reference}| = {err:.3g} (logits up to {scale:.3g})')
    return err <= 1e-4 * max(1.0, scale)


def main(out_dir, write_all, default_reference, reference_help):
    """The command line both scripts share: write the goldens, or --verify DIR [--reference NAME]."""
    ap = argparse.ArgumentParser()
    ap.add_argument('--verify', help='a directory nodetron exported (from ' + reference_help + ')')
    ap.add_argument('--reference', default=default_reference, help='which golden model the export came from')
    a = ap.parse_args()
    if a.verify:
        sys.exit(0 if verify(out_dir, a.verify, a.reference) else 1)
    write_all()
