#!/usr/bin/python3
"""Encodes a text with a GPT-2-style tokenizer folder (vocab.json, merges.txt) into the token
arrays `cohort train --data` reads: OUT/train_tokens.npy (the first 90%) and OUT/val_tokens.npy
(the rest), uint16 where the vocabulary fits, else uint32.

    PYTHONPATH=build/release/python scripts/encode_tokens.py runs/bpe \
        datasets/tinyshakespeare/input.txt runs/shakespeare-bpe
"""
import argparse
import os

import numpy as np

import cohort


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tokenizer")
    p.add_argument("text")
    p.add_argument("out")
    p.add_argument("--val-fraction", type=float, default=0.1)
    a = p.parse_args()
    tok = cohort.Tokenizer(a.tokenizer)
    with open(a.text, "rb") as f:
        ids = tok.encode(f.read())
    ids = ids.astype(np.uint16 if len(tok) <= 65536 else np.uint32)
    cut = int(len(ids) * (1 - a.val_fraction))
    os.makedirs(a.out, exist_ok=True)
    np.save(os.path.join(a.out, "train_tokens.npy"), ids[:cut])
    np.save(os.path.join(a.out, "val_tokens.npy"), ids[cut:])
    print(f"encode_tokens: {len(ids)} tokens ({cut} train, {len(ids) - cut} val) of a "
          f"{len(tok)}-token vocabulary -> {a.out}")


if __name__ == "__main__":
    main()
