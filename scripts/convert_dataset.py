#!/usr/bin/env python3
"""Converts an IDX dataset folder (the four Fashion-MNIST files, raw or .gz) to the other
formats `cohort train --data` reads, for the tests and as a worked example of each format.

  convert_dataset.py IDX_DIR OUT_DIR --format npy-uint8|npy-float32|csv|png-folders
                    [--nudge] [--class-order]

npy-uint8:   train_x.npy (N, 28, 28) uint8 and train_y.npy (N,) int64, likewise test_*;
             cohort scales uint8 by 1/255 as it does IDX pixels.
npy-float32: X = pixel / 255 computed in float32 (as cohort does), shape (N, 784).
csv:         train.csv (with a header line) and test.csv (without): label, then the 784 features
             pixel / 255 in float32, each written with 9 significant digits, which name every
             float32 exactly, so the text round-trips to the same floats.
png-folders: train/<label>/<index>.png and test/<label>/<index>.png, grey 8-bit PNG files (the
             folder layout torchvision's ImageFolder reads); labels and indices zero-padded, so
             cohort's order (class folder, then file name, both sorted) is label, then index.
--class-order: (npy-uint8) the samples sorted by label, stably: the order in which cohort reads
             the png-folders of the same data.
--nudge:     moves each non-zero feature of the first training sample up by one float32 ulp
             (npy-float32 only): a control that the digest test can tell the data apart.
Needs numpy (Debian: python3-numpy). Deterministic: same input, same bytes.
"""
import argparse
import gzip
import os
import struct
import sys
import zlib

import numpy as np

FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def read_idx(folder, stem, ndim):
    for name in (stem + ".gz", stem):
        path = os.path.join(folder, name)
        if os.path.exists(path):
            with open(path, "rb") as f:
                raw = f.read()
            if raw[:2] == b"\x1f\x8b":
                raw = gzip.decompress(raw)
            if raw[0:3] != b"\x00\x00\x08" or raw[3] != ndim:
                sys.exit(f"{path}: not a uint8 IDX file of {ndim} dimensions")
            dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
            return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)
    sys.exit(f"{folder}: {stem}[.gz] not found")


def png_bytes(image):
    """A grey 8-bit PNG of a (H, W) uint8 array: the signature, IHDR, one zlib IDAT, IEND."""
    height, width = image.shape
    raw = b"".join(b"\x00" + image[r].tobytes() for r in range(height))  # filter 0 per row

    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data +
                struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def write_png_folders(folder, x, y):
    classes, count = int(y.max()) + 1, len(y)
    for i in range(count):
        label = f"{int(y[i]):0{len(str(classes - 1))}d}"
        os.makedirs(os.path.join(folder, label), exist_ok=True)
        with open(os.path.join(folder, label, f"{i:0{len(str(count - 1))}d}.png"), "wb") as f:
            f.write(png_bytes(x[i]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("idx_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--format", required=True,
                    choices=["npy-uint8", "npy-float32", "csv", "png-folders"])
    ap.add_argument("--nudge", action="store_true")
    ap.add_argument("--class-order", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    for split, (images, labels) in FILES.items():
        x = read_idx(a.idx_dir, images, 3)  # (N, 28, 28) uint8
        y = read_idx(a.idx_dir, labels, 1).astype(np.int64)  # (N,)
        if a.class_order:
            order = np.argsort(y, kind="stable")
            x, y = x[order], y[order]
        features = (x.reshape(len(x), -1).astype(np.float32) / np.float32(255))  # (N, 784)
        if a.format == "png-folders":
            write_png_folders(os.path.join(a.out_dir, split), x, y)
        elif a.format == "npy-uint8":
            np.save(os.path.join(a.out_dir, f"{split}_x.npy"), x)
            np.save(os.path.join(a.out_dir, f"{split}_y.npy"), y)
        elif a.format == "npy-float32":
            if a.nudge and split == "train":
                # Every non-zero pixel (0 + 1 ulp would be a denormal): one ulp of a single
                # feature can round away in the first layer's f32 sums (it did on AVX2).
                lit = features[0] > 0
                features[0, lit] = np.nextafter(features[0, lit], np.float32(2))
            np.save(os.path.join(a.out_dir, f"{split}_x.npy"), features)
            np.save(os.path.join(a.out_dir, f"{split}_y.npy"), y)
        else:
            table = np.column_stack([y.astype(np.float64), features.astype(np.float64)])
            header = ",".join(["label"] + [f"p{i}" for i in range(features.shape[1])])
            np.savetxt(os.path.join(a.out_dir, f"{split}.csv"), table, delimiter=",",
                       fmt=["%d"] + ["%.9g"] * features.shape[1],
                       header=header if split == "train" else "", comments="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
