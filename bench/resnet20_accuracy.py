#!/usr/bin/python3
"""ResNet-20 on Fashion-MNIST to a target test accuracy: cohort (examples/resnet20.toml's recipe,
or any extra flags) for each seed, and optionally the PyTorch peer with the same recipe
(bench/peers/torch_peer.py acc --model resnet20 --augment --lr 0.1 --wd 5e-4 --cosine), one after
the other. Reports each run's test accuracy per epoch, the training seconds to first reach
--target (both count training steps only: cohort's `elapsed_s`, the peer's per-epoch step time
summed), and writes every curve to --out (JSON) for the README and docs.

Usage: bench/resnet20_accuracy.py [--cohort build/release/cohort] [--seeds 1,2,3] [--epochs 30]
                                  [--peer] [--peer-bf16] [--peer-only] [--target 0.94]
                                  [--out runs/resnet20_accuracy.json] [--metrics-dir runs]
                                  [-- extra cohort flags]
Every child runs in its own process group under --timeout seconds (peer_compare.run).
"""
import argparse
import ast
import json
import os
import sys
import time

import peer_compare  # bench/, beside this script: its process-group runner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER = peer_compare.PEER  # bench/peers/torch_peer.py


def first_reach(curve, target):
    """Training seconds and epoch at which the test accuracy first reached target, or None."""
    for e in curve:
        if e["test_accuracy"] >= target:
            return e["elapsed_s"], e["epoch"]
    return None


def cohort_run(a, seed, extra):
    metrics = os.path.join(a.metrics_dir, f"resnet20-seed{seed}-metrics.jsonl")
    summary = os.path.join(a.metrics_dir, f"resnet20-seed{seed}-summary.json")
    for f in (metrics, summary):
        if os.path.exists(f):
            os.remove(f)
    cmd = [a.cohort, "train", "--config", a.config, "--seed", str(seed), "--epochs", str(a.epochs),
           "--metrics", metrics, "--summary", summary, "--quiet"] + extra
    print("running:", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    peer_compare.run(cmd, timeout=a.timeout)
    wall = time.perf_counter() - t0
    curve = []
    with open(metrics) as f:
        for line in f:
            r = json.loads(line)
            if r.get("kind") == "epoch":
                curve.append({"epoch": r["epoch"], "test_accuracy": r["test_accuracy"],
                              "train_loss": r["train_loss"], "elapsed_s": r["elapsed_s"]})
    s = json.load(open(summary))
    return {"who": "cohort", "seed": seed, "curve": curve, "wall_s": wall,
            "final_test_accuracy": s["test_accuracy"], "samples_per_second": s["samples_per_second"],
            "precision": s.get("precision"), "micro_batch": s.get("micro_batch"),
            "metrics": metrics}


def peer_run(a, bf16):
    cmd = ["/usr/bin/python3", PEER, "acc", "--model", "resnet20", "--threads", "2", "--epochs",
           str(a.epochs), "--augment", "--lr", "0.1", "--wd", "5e-4", "--cosine"]
    if bf16:
        cmd.append("--bf16")
    print("running:", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    out = peer_compare.run(cmd, capture=True, timeout=a.timeout)
    wall = time.perf_counter() - t0
    curve, elapsed = [], 0.0
    for line in out.splitlines():
        if line.startswith("{'epoch'"):
            h = ast.literal_eval(line)
            elapsed += 60000 // 256 * 256 / h["samples_per_s"]
            curve.append({"epoch": h["epoch"], "test_accuracy": h["test_acc"],
                          "train_loss": h["train_loss"], "elapsed_s": elapsed})
    return {"who": "pytorch" + (" bf16" if bf16 else " f32"), "seed": None, "curve": curve,
            "wall_s": wall, "final_test_accuracy": curve[-1]["test_accuracy"] if curve else None}


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    p = argparse.ArgumentParser()
    p.add_argument("--cohort", default=os.path.join(ROOT, "build/release/cohort"))
    p.add_argument("--config", default=os.path.join(ROOT, "examples/resnet20.toml"))
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--target", type=float, default=0.94)
    p.add_argument("--peer", action="store_true", help="also run the PyTorch peer (f32)")
    p.add_argument("--peer-bf16", action="store_true", help="also run the peer with --bf16")
    p.add_argument("--peer-only", action="store_true", help="run no cohort seeds")
    p.add_argument("--timeout", type=float, default=3 * 3600, help="seconds per child process")
    p.add_argument("--out", default=os.path.join(ROOT, "runs/resnet20_accuracy.json"))
    p.add_argument("--metrics-dir", default=os.path.join(ROOT, "runs"))
    a = p.parse_args(argv)
    os.makedirs(a.metrics_dir, exist_ok=True)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    runs = []
    if not a.peer_only:
        for seed in [int(s) for s in a.seeds.split(",")]:
            runs.append(cohort_run(a, seed, extra))
            json.dump(runs, open(a.out, "w"), indent=1)
    for flag, bf16 in ((a.peer, False), (a.peer_bf16, True)):
        if flag:
            runs.append(peer_run(a, bf16))
            json.dump(runs, open(a.out, "w"), indent=1)
    print(f"\n| run | seed | final test accuracy | best | training s to {a.target} (epoch) "
          "| training s, all epochs | wall s |")
    print("|---|---|---|---|---|---|---|")
    for r in runs:
        reach = first_reach(r["curve"], a.target)
        best = max(e["test_accuracy"] for e in r["curve"]) if r["curve"] else float("nan")
        total = r["curve"][-1]["elapsed_s"] if r["curve"] else float("nan")
        print(f"| {r['who']} | {r['seed'] or ''} | {r['final_test_accuracy']:.4f} | {best:.4f} | "
              f"{'%.0f (%d)' % reach if reach else 'not reached'} | {total:.0f} | "
              f"{r['wall_s']:.0f} |")


if __name__ == "__main__":
    main()
