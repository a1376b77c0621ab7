#!/usr/bin/python3
"""One-off check that cohort's `resnet20` is the PyTorch peer's ResNet20: loads a cohort checkpoint
(its weights in PyTorch's order, its bn running statistics) into the ResNet20 of
bench/peers/torch_peer.py and compares the inference logits on the first --rows test images with
`cohort eval --logits`.

Usage: bench/resnet20_logits_check.py --checkpoint runs/resnet20.ckpt
                                      [--cohort build/release/cohort] [--rows 500]
The checkpoint must be of `--model resnet20` trained without `--augment normalize` (the peer
does not normalize). Prints the largest absolute and relative logit difference and the
fraction of rows whose predicted class agrees.
"""
import argparse
import os
import struct
import subprocess
import sys
import tempfile
import zlib

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench", "peers"))
import torch_peer  # noqa: E402  the peer's ResNet20 and data loader


def sections(path):
    """The checkpoint's sections by tag (format: src/checkpoint/checkpoint.cpp)."""
    raw = open(path, "rb").read()
    assert raw[:8] == b"COHORTCK", "not a cohort checkpoint"
    version, count = struct.unpack_from("<II", raw, 8)
    at, out = 16, {}
    for _ in range(count):
        tag, length = struct.unpack_from("<4sQ", raw, at)
        at += 12
        payload = raw[at:at + length]
        at += length
        (crc,) = struct.unpack_from("<I", raw, at)
        at += 4
        assert zlib.crc32(payload) == crc, f"section {tag} crc"
        out[tag.decode()] = payload
    return version, out


def unpack(flat, tensors):
    """Tensors of the given shapes from a ParamLayout array: each starts on a 16-float line."""
    at, out = 0, []
    for shape in tensors:
        at = (at + 15) // 16 * 16
        n = int(np.prod(shape))
        out.append(torch.from_numpy(flat[at:at + n].copy()).reshape(shape))
        at += n
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--cohort", default=os.path.join(ROOT, "build/release/cohort"))
    p.add_argument("--rows", type=int, default=500)
    a = p.parse_args()
    version, sec = sections(a.checkpoint)
    weights = np.frombuffer(sec["PARM"], dtype="<f4")
    stats = np.frombuffer(sec["BNST"], dtype="<f4")
    model = torch_peer.ResNet20().eval()
    params = list(model.named_parameters())
    buffers = [(n, b) for n, b in model.named_buffers() if n.endswith(("running_mean", "running_var"))]
    for (name, t), v in zip(params, unpack(weights, [t.shape for _, t in params])):
        t.data.copy_(v)
    for (name, b), v in zip(buffers, unpack(stats, [b.shape for _, b in buffers])):
        b.copy_(v)
    print(f"checkpoint version {version}: {len(params)} parameter tensors "
          f"({sum(t.numel() for _, t in params)} values), {len(buffers)} running statistics")
    _, _, xte, _ = torch_peer.load_data()
    with torch.no_grad():
        theirs = model(xte[:a.rows].reshape(-1, 1, 28, 28)).numpy()
    with tempfile.TemporaryDirectory() as d:
        logits = os.path.join(d, "logits.npy")
        subprocess.run([a.cohort, "eval", "--checkpoint", a.checkpoint, "--logits", logits,
                        "--quiet"], check=True)
        ours = np.load(logits)[:a.rows]
    diff = np.abs(ours - theirs)
    scale = np.abs(theirs).max()
    agree = (ours.argmax(1) == theirs.argmax(1)).mean()
    print(f"rows {a.rows}: max |cohort - pytorch| {diff.max():.3g} (largest |logit| {scale:.3g}, "
          f"relative {diff.max() / scale:.3g}); predicted classes agree on {agree:.4f} of rows")


if __name__ == "__main__":
    main()
