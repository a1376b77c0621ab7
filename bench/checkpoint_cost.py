#!/usr/bin/python3
"""What a checkpoint costs a run: for each model, `cohort train --steps N --save F --save-every 1
--summary S` --reps times; the summary's `checkpoints` (saves, seconds: the state copied out of
the trainer, encoded with a crc32 per section, written, fsynced, renamed, the folder fsynced)
gives the milliseconds per save, beside the run's mean step time. Prints a Markdown table of the
medians over the runs. The work lost per failure is at most --save-every steps, so a step's time x
N against this cost chooses N.

Usage: bench/checkpoint_cost.py [--cohort build/release/cohort] [--data DIR] [--reps 3]
                                [--dir runs/checkpoint_cost] [--models mlp,cnn,resnet20]
The folder (--dir) is where the checkpoints go: put it on the filesystem the runs will save to.
"""
import argparse
import json
import os
import statistics

import peer_compare  # bench/, beside this script: its process-group runner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = {  # name: (flags, steps)
    "mlp": (["--model", "mlp:784-512-256-10"], 100),
    "cnn": (["--model", "cnn"], 40),
    "resnet20": (["--model", "resnet20"], 20),
}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cohort", default=os.path.join(ROOT, "build/release/cohort"))
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--dir", default=os.path.join(ROOT, "runs/checkpoint_cost"))
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--timeout", type=float, default=600)
    a = p.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    ckpt, summary = os.path.join(a.dir, "cost.ckpt"), os.path.join(a.dir, "summary.json")
    print("| model | checkpoint file | step (ms) | save (ms) | saves per run |")
    print("|---|---|---|---|---|")
    for name in a.models.split(","):
        flags, steps = MODELS[name]
        cmd = [a.cohort, "train", "--data", a.data, "--batch", "256", "--steps", str(steps),
               "--warmup-steps", "0", "--quiet", "--save", ckpt, "--save-every", "1",
               "--summary", summary] + flags
        save_ms, step_ms = [], []
        for _ in range(a.reps):
            peer_compare.run(cmd, timeout=a.timeout)
            with open(summary) as f:
                s = json.load(f)
            save_ms.append(1e3 * s["checkpoints"]["seconds"] / s["checkpoints"]["saves"])
            step_ms.append(1e3 * s["time"]["step"] / s["steps"])
        print(f"| {name} | {os.path.getsize(ckpt) / 1e6:.2f} MB | "
              f"{statistics.median(step_ms):.1f} | {statistics.median(save_ms):.1f} | "
              f"{s['checkpoints']['saves']} |", flush=True)
    for f in (ckpt, summary):
        os.remove(f)


if __name__ == "__main__":
    main()
