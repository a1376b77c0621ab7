"""Token corpora in both formats train alike: the same tokens as train_tokens.npy/val_tokens.npy
and as llm.c shards (the training split cut into three shards, uint16, header magic 20240520) give
one weights digest, with 1 and 2 workers and through a resume; a control with the tokens moved by one
gives another (so the comparison can fail). Seed 3, printed.

    token_formats_test.py COHORT_BINARY
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

SEED = 3


def shard(path, tokens):
    header = struct.pack("<3i", 20240520, 1, len(tokens)) + b"\0" * (1024 - 12)
    with open(path, "wb") as f:
        f.write(header + np.asarray(tokens, dtype="<u2").tobytes())


def digest(cohort, data, work, name, *extra):
    summary = os.path.join(work, name + ".json")
    subprocess.run([cohort, "train", "--data", data, "--model", "gpt:1-2-16-8", "--batch", "8",
                    "--steps", "6", "--seed", str(SEED), "--quiet", "--summary", summary, *extra],
                   check=True, timeout=300)
    with open(summary) as f:
        return json.load(f)["weights_digest"]


def main():
    cohort = sys.argv[1]
    print(f"seed {SEED}")
    rng = np.random.default_rng(SEED)
    train = rng.integers(0, 300, 5000).astype(np.uint16)
    val = rng.integers(0, 300, 500).astype(np.uint16)
    with tempfile.TemporaryDirectory() as work:
        arrays, shards, changed = (os.path.join(work, d) for d in ("arrays", "shards", "changed"))
        for d in (arrays, shards, changed):
            os.mkdir(d)
        np.save(os.path.join(arrays, "train_tokens.npy"), train)
        np.save(os.path.join(arrays, "val_tokens.npy"), val)
        for i, part in enumerate(np.array_split(train, 3)):
            shard(os.path.join(shards, f"corpus_train_{i:06d}.bin"), part)
        shard(os.path.join(shards, "corpus_val_000000.bin"), val)
        other = np.roll(train, 1)  # every window moves by a token
        shard(os.path.join(changed, "corpus_train_000000.bin"), other)
        shard(os.path.join(changed, "corpus_val_000000.bin"), val)

        want = digest(cohort, arrays, work, "arrays")
        results = {
            "shards": digest(cohort, shards, work, "shards"),
            "shards, 1 worker": digest(cohort, shards, work, "w1", "--workers", "1"),
        }
        ck = os.path.join(work, "half.ckpt")
        digest(cohort, shards, work, "half", "--steps", "3", "--save", ck)
        results["shards, resumed at step 3"] = digest(cohort, shards, work, "resumed", "--resume", ck)
        control = digest(cohort, changed, work, "changed")
        status = 0
        print(f"token arrays: {want}")
        for name, got in results.items():
            print(f"{name}: {got}")
            if got != want:
                print(f"FAIL: {name} gave {got}, the token arrays {want}")
                status = 1
        print(f"control (the tokens moved by one): {control}")
        if control == want:
            print("FAIL: the control gave the arrays' digest: the comparison cannot fail")
            status = 1
        return status


if __name__ == "__main__":
    sys.exit(main())
