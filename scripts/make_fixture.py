#!/usr/bin/python3
"""Cuts the test fixture datasets/fixture/ from the real Fashion-MNIST (Debian's
dataset-fashion-mnist): the first 512 training and the first 256 test images with their labels,
as IDX .gz files in the original format. Deterministic: same input, same bytes (gzip mtime 0).
Usage: scripts/make_fixture.py [SRC_DIR] [DST_DIR]"""
import gzip
import sys
from pathlib import Path

SRC = Path(sys.argv[1] if len(sys.argv) > 1 else "/usr/share/datasets/fashion-mnist")
DST = Path(sys.argv[2] if len(sys.argv) > 2 else Path(__file__).resolve().parent.parent / "datasets/fixture")
CUTS = {"train": 512, "t10k": 256}


def cut(name, count):
    raw = gzip.decompress((SRC / f"{name}.gz").read_bytes())
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    item = 1
    for d in dims[1:]:
        item *= d
    header = raw[:4] + count.to_bytes(4, "big") + raw[8: 4 + 4 * ndim]
    body = raw[4 + 4 * ndim: 4 + 4 * ndim + count * item]
    DST.mkdir(parents=True, exist_ok=True)
    with open(DST / f"{name}.gz", "wb") as f:
        with gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as g:
            g.write(header + body)


for split, n in CUTS.items():
    cut(f"{split}-images-idx3-ubyte", n)
    cut(f"{split}-labels-idx1-ubyte", n)
