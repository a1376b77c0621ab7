#!/usr/bin/python3
"""Side-by-side throughput of cohort and the PyTorch peer (../shared/peers/torch_peer.py) on the
same model and batch, alternating A and B in one run and reporting medians and their ratio.

The machine is shared and noisy, so only ratios measured in the same run mean anything.
cohort's samples/s counts training steps only (its summary's `samples_per_second`: no data
loading, no evaluation; the first step, which creates the oneDNN primitives, is included). The
peer's figure is its `tput` median (20 warm-up steps excluded).

Usage: bench/peer_compare.py [--reps 5] [--steps 300] [--cases mlp256,mlp32,scaling,micro,wgrads,cnn,layouts]
       bench/peer_compare.py --cases versions --baseline OLD/cohort   (this build against another)
Needs: python3-torch and libopenblas0-openmp (see the peer's header), build/release/cohort.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COHORT = os.path.join(ROOT, "build/release/cohort")
PEER = os.path.join(ROOT, "../shared/peers/torch_peer.py")


def cohort(args, steps, binary=COHORT):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [binary, "train", "--quiet", "--steps", str(steps), "--summary", f.name] + args
        subprocess.run(cmd, check=True)
        s = json.load(open(f.name))
    t = s["time"]
    return s["samples_per_second"], t


def peer(args, steps):
    cmd = ["/usr/bin/python3", PEER, "tput", "--steps", str(steps), "--reps", "1"] + args
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    line = [l for l in out.splitlines() if l.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])["median"], None


def side_by_side(title, runners, reps, steps):
    """runners: list of (label, fn(steps) -> (samples/s, time)). Alternates them reps times."""
    rates = {label: [] for label, _ in runners}
    shares = {label: [] for label, _ in runners}
    cpu = {label: [] for label, _ in runners}
    for _ in range(reps):
        for label, fn in runners:
            r, t = fn(steps)
            rates[label].append(r)
            if t:
                # The root's wall share (sum + optimizer on the critical path; with batch weight
                # gradients it also holds the root's GEMMs), and the share of all workers' time
                # spent reducing and in the optimizer (the GEMMs count as compute).
                shares[label].append(t["reduce_critical"] / t["step"])
                cpu[label].append(t["reduce"] / (t["reduce"] + t["compute"] + t["data"] + t["idle"]))
    print(f"\n### {title}\n")
    print("| run | samples/s (median) | all repetitions | root wall share of step (median) "
          "| reduce + optimizer share of worker time (median) |")
    print("|---|---|---|---|---|")
    med = {}
    for label, _ in runners:
        med[label] = statistics.median(rates[label])
        share = f"{100 * statistics.median(shares[label]):.1f}%" if shares[label] else "–"
        c = f"{100 * statistics.median(cpu[label]):.1f}%" if cpu[label] else "–"
        print(f"| {label} | {med[label]:,.0f} | {', '.join(f'{x:,.0f}' for x in rates[label])} "
              f"| {share} | {c} |")
    sys.stdout.flush()
    return med, rates


def paired(rates, num, dens, what):
    """Per repetition: num's rate over the best of dens' rates in the same round (neighbours' load
    comes and goes over minutes, so a round's runs share it); prints the median of those ratios."""
    r = [rates[num][i] / max(rates[d][i] for d in dens) for i in range(len(rates[num]))]
    print(f"per-round ratios {what}: {', '.join(f'{x:.2f}' for x in r)}; "
          f"median **{statistics.median(r):.2f}x**")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--cases", default="mlp256,mlp32,scaling,micro,wgrads,cnn,layouts")
    p.add_argument("--baseline", help="another cohort binary, for --cases versions")
    a = p.parse_args()
    cases = a.cases.split(",")
    print(f"reps {a.reps}, steps {a.steps}, cohort {COHORT}")
    if "mlp256" in cases:
        med, rates = side_by_side(
            "MLP, batch 256: cohort 2 workers vs PyTorch 2 threads",
            [("cohort --workers 2", lambda s: cohort(["--workers", "2", "--batch", "256"], s)),
             ("torch --threads 2", lambda s: peer(["--model", "mlp", "--threads", "2", "--batch", "256"], s))],
            a.reps, a.steps)
        print(f"\nratio cohort / torch: **{med['cohort --workers 2'] / med['torch --threads 2']:.2f}x**")
        paired(rates, "cohort --workers 2", ["torch --threads 2"], "cohort / torch")
    if "mlp32" in cases:
        med, rates = side_by_side(
            "MLP, batch 32: cohort 2 workers vs PyTorch 1 and 2 threads",
            [("cohort --workers 2", lambda s: cohort(["--workers", "2", "--batch", "32"], s * 8)),
             ("torch --threads 1", lambda s: peer(["--model", "mlp", "--threads", "1", "--batch", "32"], s * 8)),
             ("torch --threads 2", lambda s: peer(["--model", "mlp", "--threads", "2", "--batch", "32"], s * 8))],
            a.reps, a.steps)
        best = max(med["torch --threads 1"], med["torch --threads 2"])
        print(f"\nratio cohort / best torch: **{med['cohort --workers 2'] / best:.2f}x**")
        paired(rates, "cohort --workers 2", ["torch --threads 1", "torch --threads 2"],
               "cohort / the round's best torch")
    if "scaling" in cases:
        med, rates = side_by_side(
            "Scaling, MLP batch 256: 2 workers vs 1 worker",
            [("cohort --workers 1", lambda s: cohort(["--workers", "1"], s)),
             ("cohort --workers 2", lambda s: cohort(["--workers", "2"], s))],
            a.reps, a.steps)
        print(f"\nratio 2 / 1 workers: **{med['cohort --workers 2'] / med['cohort --workers 1']:.2f}x**")
        paired(rates, "cohort --workers 2", ["cohort --workers 1"], "2 / 1 workers")
    if "micro" in cases:
        runners = []
        for m in (32, 64, 128):
            runners.append((f"--micro-batch {m}",
                            (lambda m: lambda s: cohort(["--workers", "2", "--micro-batch", str(m)], s))(m)))
        med, _ = side_by_side("Cost of reproducibility: micro-batch at 2 workers, batch 256 "
                              "(128 = one leaf per worker)", runners, a.reps, a.steps)
        base = med["--micro-batch 128"]
        for label, v in med.items():
            print(f"- {label}: {v / base:.3f} of one leaf per worker")
    if "wgrads" in cases:
        for batch, mult in ((32, 8), (64, 4), (128, 2), (256, 1)):
            med, _ = side_by_side(
                f"Weight gradients per leaf vs over the batch, MLP batch {batch}, 2 workers",
                [(f"--weight-grads {m}",
                  (lambda m: lambda s: cohort(["--workers", "2", "--batch", str(batch),
                                               "--weight-grads", m], s * mult))(m))
                 for m in ("leaf", "batch")],
                a.reps, a.steps)
            print(f"\nratio batch / leaf at batch {batch}: "
                  f"**{med['--weight-grads batch'] / med['--weight-grads leaf']:.3f}**")
    if "cnn" in cases:
        med, rates = side_by_side(
            "CNN (the cnn preset), batch 256: cohort 2 workers vs PyTorch 2 threads",
            [("cohort --model cnn --workers 2", lambda s: cohort(["--model", "cnn", "--workers", "2"], s // 4)),
             ("torch --model cnn --threads 2", lambda s: peer(["--model", "cnn", "--threads", "2"], s // 4))],
            a.reps, a.steps)
        r = med["cohort --model cnn --workers 2"]
        print(f"\nratio cohort / torch: **{r / med['torch --model cnn --threads 2']:.2f}x**; "
              f"cohort at 23.1 MFLOP per sample: {r * 23.1e6 / 1e9:.0f} GFLOP/s, "
              f"{100 * r * 23.1e6 / 233e9:.0f}% of the 233 GFLOP/s 2-core FMA peak")
        paired(rates, "cohort --model cnn --workers 2", ["torch --model cnn --threads 2"],
               "cohort / torch")
    if "versions" in cases:
        # This build against --baseline (e.g. the previous commit's binary), same flags,
        # alternating: the MLP at batch 256 and the cnn preset, 2 workers.
        for title, flags, steps in (("MLP batch 256", ["--workers", "2"], a.steps),
                                    ("cnn, batch 256", ["--model", "cnn", "--workers", "2"],
                                     a.steps // 4)):
            med, rates = side_by_side(
                f"This build vs the baseline, {title}",
                [("baseline", lambda s, f=flags: cohort(f, s, a.baseline)),
                 ("this build", lambda s, f=flags: cohort(f, s))],
                a.reps, steps)
            print(f"\nratio this build / baseline: **{med['this build'] / med['baseline']:.3f}**")
            paired(rates, "this build", ["baseline"], "this build / baseline")
    if "layouts" in cases:
        med, _ = side_by_side(
            "CNN layouts: oneDNN's blocked choice vs plain nchw, 2 workers",
            [("blocked (default)", lambda s: cohort(["--model", "cnn", "--workers", "2"], s // 4)),
             ("--plain-layouts", lambda s: cohort(["--model", "cnn", "--workers", "2", "--plain-layouts"], s // 4))],
            a.reps, a.steps)
        print(f"\nratio plain / blocked: **{med['--plain-layouts'] / med['blocked (default)']:.2f}**")


if __name__ == "__main__":
    sys.exit(main())
