#!/usr/bin/python3
"""Test accuracy of --precision bf16 against f32: the same training (model, seed, epochs, 2
workers) in each precision, f32 and bf16 run back to back per seed, and a Markdown table of the
two test accuracies, their difference and whether it is within --tolerance (default 0.005), with
each run's wall time (the whole process: startup, data loading, training and evaluation).

Usage: bench/precision_accuracy.py [--cohort build/release/cohort] [--epochs 5] [--seeds 1,2,3]
                                   [--models mlp:784-512-256-10,cnn] [--workers 2]
                                   [--tolerance 0.005] [--timeout 1800] [--steps N]
--steps N stops every run after N steps (for a smoke test of the script, not a measurement).
Every child runs in its own process group under --timeout seconds; on expiry the group is
terminated and the script stops.
"""
import argparse
import json
import os
import sys
import tempfile
import time

import peer_compare  # bench/, beside this script: its process-group runner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COHORT = os.path.join(ROOT, "build/release/cohort")
TIMEOUT = 1800  # seconds per child process (--timeout); a 5-epoch cnn run takes ~1-2 minutes


def run(cmd):
    """cmd in a process group of its own under TIMEOUT (peer_compare.run)."""
    peer_compare.run(cmd, timeout=TIMEOUT)


def train(model, seed, precision, a):
    """One cohort train run; returns (its summary, wall seconds)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [COHORT, "train", "--model", model, "--epochs", str(a.epochs), "--seed", str(seed),
               "--precision", precision, "--workers", str(a.workers), "--quiet", "--summary", f.name]
        if a.steps:
            cmd += ["--steps", str(a.steps)]
        t0 = time.perf_counter()
        run(cmd)
        wall = time.perf_counter() - t0
        s = json.load(open(f.name))
    if s.get("precision", precision) != precision:
        raise SystemExit(f"{COHORT} wrote precision {s.get('precision')} for --precision {precision}")
    return s, wall


def main():
    global COHORT, TIMEOUT
    p = argparse.ArgumentParser()
    p.add_argument("--cohort", default=COHORT, help="the cohort binary")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--models", default="mlp:784-512-256-10,cnn",
                   help="comma-separated --model specs (a spec with commas, e.g. conv(32,5): "
                        "separate the models with ';' instead)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--tolerance", type=float, default=0.005)
    p.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds per child process")
    p.add_argument("--steps", type=int, default=0, help="stop each run after N steps (smoke test)")
    a = p.parse_args()
    COHORT, TIMEOUT = a.cohort, a.timeout
    seeds = [int(x) for x in a.seeds.split(",")]
    models = a.models.split(";") if ";" in a.models else a.models.split(",")
    print(f"cohort {COHORT}, epochs {a.epochs}{f', steps {a.steps}' if a.steps else ''}, "
          f"workers {a.workers}, seeds {a.seeds}, tolerance {a.tolerance}")
    rows = []
    for model in models:
        for seed in seeds:
            r = {}
            for precision in ("f32", "bf16"):
                r[precision] = train(model, seed, precision, a)
            f32, bf16 = r["f32"][0]["test_accuracy"], r["bf16"][0]["test_accuracy"]
            rows.append((model, seed, f32, bf16, r["f32"][1], r["bf16"][1],
                         r["f32"][0]["samples_per_second"], r["bf16"][0]["samples_per_second"]))
            print(f"{model} seed {seed}: f32 {f32:.4f} ({r['f32'][1]:.1f} s), "
                  f"bf16 {bf16:.4f} ({r['bf16'][1]:.1f} s)", flush=True)
    print("\n| model | seed | f32 test accuracy | bf16 test accuracy | bf16 − f32 "
          f"| within {a.tolerance} | f32 wall s | bf16 wall s | f32 samples/s | bf16 samples/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    within = 0
    for model, seed, f32, bf16, wf, wb, sf, sb in rows:
        ok = abs(bf16 - f32) <= a.tolerance
        within += ok
        print(f"| {model} | {seed} | {f32:.4f} | {bf16:.4f} | {bf16 - f32:+.4f} | {'yes' if ok else 'no'} "
              f"| {wf:.1f} | {wb:.1f} | {sf:,.0f} | {sb:,.0f} |")
    print(f"\n{within} of {len(rows)} within {a.tolerance}")
    for model in models:
        d = [r[3] - r[2] for r in rows if r[0] == model]
        print(f"- {model}: mean bf16 − f32 {sum(d) / len(d):+.4f} over {len(d)} seeds")


if __name__ == "__main__":
    sys.exit(main())
