#!/usr/bin/env python3
"""Every --reducer strategy x root mode in `cohort train`: the final loss after N steps (default
200) and whether the weights digest is the same at 1 and 2 workers. Losses and digests do not
depend on timing, so this may run on a busy machine. Prints a Markdown table.

Usage: bench/strategy_table.py [--steps 200] [--cohort build/release/cohort]
"""
import argparse
import json
import subprocess
import tempfile

STRATEGIES = ["tree", "chunk_owner", "parameter_server", "atomic", "mutex", "serial"]
MODES = [("fused, batch", ["--weight-grads", "batch"]),
         ("fused, leaf", ["--weight-grads", "leaf"]),
         ("two-phase (clip 1), batch", ["--weight-grads", "batch", "--clip-norm", "1"]),
         ("two-phase (clip 1), leaf", ["--weight-grads", "leaf", "--clip-norm", "1"])]


def run(cohort, steps, strategy, flags, workers):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        # micro-batch 32: 8 leaves per step of 256, so arrival order matters to atomic and mutex
        cmd = [cohort, "train", "--steps", str(steps), "--quiet", "--reducer", strategy,
               "--workers", str(workers), "--micro-batch", "32", "--log-every", "1",
               "--summary", f.name, "--metrics", f.name + ".jsonl"] + flags
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            return None, p.stderr.strip()
        summary = json.load(open(f.name))
        last = [json.loads(l) for l in open(f.name + ".jsonl") if '"kind":"step"' in l][-1]
        return (last["loss"], summary["weights_digest"]), ""


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--steps", type=int, default=200)
    a.add_argument("--cohort", default="build/release/cohort")
    args = a.parse_args()
    print(f"| strategy | root mode | loss at step {args.steps} (1 worker / 2 workers) | "
          "same digest at 1 and 2 workers |")
    print("|---|---|---|---|")
    for s in STRATEGIES:
        for name, flags in MODES:
            one, err1 = run(args.cohort, args.steps, s, flags, 1)
            two, err2 = run(args.cohort, args.steps, s, flags, 2)
            if one is None or two is None:
                print(f"| {s} | {name} | refused: {err1 or err2} | |")
                continue
            same = "yes" if one[1] == two[1] else "no"
            print(f"| {s} | {name} | {one[0]:.4f} / {two[0]:.4f} | {same} |", flush=True)


if __name__ == "__main__":
    main()
