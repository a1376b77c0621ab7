#!/usr/bin/python3
"""A language model's safetensors export in PyTorch (ctest export_gpt_in_pytorch): cohort trains
gpt:2-2-32-16 for 30 steps on the first 20,000 characters of Tiny Shakespeare, exports it, and
bench/peers/torch_gpt_peer.py's GPT (nanoGPT's module tree) loads the file with strict=True — both
transformer.wte.weight and the tied lm_head.weight present — and computes `cohort eval`'s
validation loss (the whole split in non-overlapping windows) within 1e-4.

  tests/export/check_gpt.py COHORT TEXT OUT_DIR
Exit 77 (1 under COHORT_REQUIRE_FRAMEWORKS=1) without torch or numpy.
"""
import json
import os
import subprocess
import sys

from export_check_util import SKIP

try:
    import numpy as np  # noqa: F401  (read_safetensors uses it)
    import torch
except ImportError as e:
    print(f"SKIP: {e} (scripts/setup.sh installs python3-torch and python3-numpy)")
    sys.exit(SKIP)

from check_safetensors import read_safetensors  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench",
                                "peers"))
import torch_gpt_peer  # noqa: E402

SPEC, LAYERS, HEADS, EMBD, BLOCK = "gpt:2-2-32-16", 2, 2, 32, 16


def run(*cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def main():
    cohort, text, out = sys.argv[1:4]
    folder = os.path.join(out, "text")
    os.makedirs(folder, exist_ok=True)
    with open(text, encoding="utf-8") as f:
        head = f.read(20000)
    with open(os.path.join(folder, "input.txt"), "w", encoding="utf-8") as f:
        f.write(head)
    ckpt, st, summary = (os.path.join(out, n) for n in ("gpt.ckpt", "gpt.safetensors", "eval.json"))
    run(cohort, "train", "--data", folder, "--model", SPEC, "--batch", "8", "--steps", "30",
        "--optimizer", "adamw", "--lr", "0.003", "--warmup-steps", "0", "--quiet", "--save", ckpt)
    run(cohort, "export", "--checkpoint", ckpt, "--format", "safetensors", "-o", st)
    run(cohort, "eval", "--checkpoint", ckpt, "--data", folder, "--quiet", "--summary", summary)
    with open(summary) as f:
        want = json.load(f)["test_loss"]
    tensors, metadata = read_safetensors(st)
    assert metadata["model"] == SPEC and metadata["naming"] == "peer", metadata
    assert "lm_head.weight" in tensors and "transformer.wte.weight" in tensors, sorted(tensors)
    assert torch.equal(tensors["lm_head.weight"], tensors["transformer.wte.weight"])
    _, val, chars = torch_gpt_peer.load_text(os.path.join(folder, "input.txt"))
    model = torch_gpt_peer.GPT(len(chars), BLOCK, LAYERS, HEADS, EMBD)
    model.load_state_dict(tensors, strict=True)
    got = torch_gpt_peer.validation_loss(model, val, BLOCK)
    print(f"{SPEC}: PyTorch validation loss {got:.6f}, cohort eval {want:.6f}")
    if abs(got - want) > 1e-4:
        sys.exit(f"{SPEC}: PyTorch's validation loss {got} differs from cohort's {want} by more "
                 "than 1e-4")


if __name__ == "__main__":
    main()
