#!/usr/bin/python3
"""cohort's language models against the project's PyTorch GPT (bench/peers/torch_gpt_peer.py),
side by side on one machine, Tiny Shakespeare.

  bench/gpt_compare.py tput [--cases cpu,medium,full] [--reps 3] [--peer-precisions f32,bf16]
                            [--baseline OTHER_COHORT]
      Training tokens/s of nanoGPT's CPU recipe (gpt:4-4-128-64, batch 12), a medium model
      (gpt:4-4-256-128, batch 32) and the full recipe (gpt:6-6-384-256-0.2, batch 64): cohort f32
      and bf16 (2 workers; bf16 where oneDNN has bf16 kernels on this CPU) and the peer f32 and
      bf16 autocast (2 threads; --peer-precisions), alternating round by round; per run its peak
      RSS (the child's, from wait4). cohort's rate is the steady one: the tokens of its steps
      after the first --skip over their time (the metrics' elapsed_s, steps only), as the peer's
      excludes its warm-up steps. Prints medians, cohort's roofline fractions and the ratio of
      cohort's best to PyTorch's best, of the medians and round by round. --baseline BIN runs
      another cohort build first in each round and prints the per-round ratios;
      --peer-precisions none leaves the peer out.
  bench/gpt_compare.py curve [--seeds 1,2,3] [--peer [--peer-precisions f32,bf16]]
                             [--eval-every 250]
      nanoGPT's CPU recipe for 2000 iterations (examples/gpt_char_cpu.toml) in f32 and bf16 per
      seed: the validation loss (whole split) every --eval-every iterations (250, the recipe's)
      against training seconds, the seconds to first reach --target (1.90); with --peer the
      PyTorch recipe too, evaluated at the same iterations. --out writes
      every curve as JSON, --svg draws them (docs/gpt_char_cpu_curves.svg). Ends with each side
      and precision's final losses over the seeds: mean, standard deviation, how many at or
      under --target (--merge adds runs saved by --out before; --seeds '' --merge FILES prints
      that of saved runs alone).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import peer_compare  # bench/: its process-group runner and TIMEOUT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER = os.path.join(ROOT, "bench", "peers", "torch_gpt_peer.py")
TEXT = os.path.join(ROOT, "datasets", "tinyshakespeare")
CASES = {  # name: (layers, heads, embd, block, batch, dropout, cohort steps, peer steps, peer reps)
    "cpu": (4, 4, 128, 64, 12, 0.0, 300, 40, 3),
    "medium": (4, 4, 256, 128, 32, 0.0, 60, 10, 3),
    "full": (6, 6, 384, 256, 64, 0.2, 8, 2, 1),
}
RECIPE = ["--optimizer", "adamw", "--lr", "1e-3", "--beta2", "0.99", "--weight-decay", "0.1",
          "--no-decay-norm-bias", "--clip-norm", "1", "--warmup-steps", "100", "--min-lr", "1e-4"]


def timed_child(cmd):
    """Runs cmd; returns (stdout, peak RSS bytes of that child)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}")
    return out, usage.ru_maxrss * 1024


def cohort_tput(binary, case, precision, tmp, skip):
    L, H, C, T, B, p, steps, _, _ = CASES[case]
    spec = f"gpt:{L}-{H}-{C}-{T}" + (f"-{p}" if p else "")
    metrics, summary = os.path.join(tmp, "m.jsonl"), os.path.join(tmp, "s.json")
    cmd = [binary, "train", "--data", TEXT, "--model", spec, "--batch", str(B), "--steps",
           str(steps), "--precision", precision, "--workers", "2", "--quiet", "--log-every", "1",
           "--metrics", metrics, "--summary", summary] + RECIPE
    _, rss = timed_child(cmd)
    with open(metrics) as f:
        lines = [json.loads(l) for l in f if '"kind":"step"' in l]
    first, last = lines[skip - 1], lines[-1]
    rate = (last["step"] - first["step"]) * B * T / (last["elapsed_s"] - first["elapsed_s"])
    with open(summary) as f:
        s = json.load(f)
    return rate, rss, s["roofline"]["fraction"]


def peer_tput(a, case, bf16):
    L, H, C, T, B, p, _, steps, reps = CASES[case]
    cmd = ["/usr/bin/python3", PEER, "tput", "--text", os.path.join(TEXT, "input.txt"),
           "--layers", str(L), "--heads", str(H), "--embd", str(C), "--block", str(T), "--batch",
           str(B), "--dropout", str(p), "--threads", "2", "--steps", str(steps), "--reps",
           str(reps), "--warmup", "2"] + (["--bf16"] if bf16 else [])
    out, rss = timed_child(cmd)
    result = json.loads([l for l in out.splitlines() if l.startswith("RESULT ")][-1][7:])
    return result["tokens_per_second"], rss


def cohort_precisions(binary):
    """f32 and bf16, or f32 alone where oneDNN has no bf16 kernels on this CPU (no AVX-512)."""
    return ("f32",) if peer_compare.bf16_none(binary) else ("f32", "bf16")


def peer_precisions(a):
    """--peer-precisions as a list ("none": the peer left out)."""
    return [p for p in a.peer_precisions.split(",") if p and p != "none"]


def cmd_tput(a):
    tmp = os.path.join(ROOT, "runs", "gpt_compare")
    os.makedirs(tmp, exist_ok=True)
    precisions = cohort_precisions(a.cohort)
    peer = peer_precisions(a)
    builds = ([("baseline", a.baseline)] if a.baseline else []) + [("cohort", a.cohort)]
    for case in a.cases.split(","):
        runs = {k: [] for k in [f"{b} {p}" for b, _ in builds for p in precisions] +
                ["PyTorch " + p for p in peer]}
        rss, fractions = {k: [] for k in runs}, {k: [] for k in runs}
        skip = 2 if case != "full" else 1
        for _ in range(a.reps):
            for who, binary in builds:
                for precision in precisions:
                    r, m, f = cohort_tput(binary, case, precision, tmp, skip)
                    runs[f"{who} {precision}"].append(r)
                    rss[f"{who} {precision}"].append(m)
                    fractions[f"{who} {precision}"].append(f)
            for bf16 in [p == "bf16" for p in peer]:
                r, m = peer_tput(a, case, bf16)
                key = "PyTorch " + ("bf16" if bf16 else "f32")
                runs[key].append(r)
                rss[key].append(m)
        med = {k: statistics.median(v) for k, v in runs.items()}
        print(f"\n{case}: tokens/s (median of {a.reps}), peak RSS (MB), roofline fraction")
        for k in runs:
            frac = f"{statistics.median(fractions[k]):6.3f}" if fractions[k] else "      "
            print(f"  {k:14} {med[k]:10.0f}   {statistics.median(rss[k]) / 1e6:8.0f} MB  {frac}   "
                  f"runs {[round(x) for x in runs[k]]}")
        best_c = max(med["cohort " + p] for p in precisions)
        if peer:
            best_p = max(med["PyTorch " + p] for p in peer)
            print(f"  cohort's best / PyTorch's best: {best_c / best_p:.2f}x", flush=True)
            per_round = [max(c) / max(q) for c, q in
                         zip(zip(*[runs["cohort " + p] for p in precisions]),
                             zip(*[runs["PyTorch " + p] for p in peer]))]
            print(f"  per round: {[round(x, 2) for x in per_round]}, median "
                  f"{statistics.median(per_round):.2f}x", flush=True)
        if a.baseline:
            for p in precisions:
                ratios = [x / y for x, y in zip(runs["cohort " + p], runs["baseline " + p])]
                print(f"  cohort {p} / baseline {p}, per round: "
                      f"{[round(x, 3) for x in ratios]}, median {statistics.median(ratios):.3f}x",
                      flush=True)


def cohort_curve(a, seed, precision, tmp):
    metrics, summary = os.path.join(tmp, "m.jsonl"), os.path.join(tmp, "s.json")
    peer_compare.run([a.cohort, "train", "--config", os.path.join(ROOT, "examples",
                                                                  "gpt_char_cpu.toml"),
                      "--seed", str(seed), "--precision", precision, "--quiet", "--metrics",
                      metrics, "--summary", summary, "--save", os.path.join(tmp, "c.ckpt"),
                      "--eval-every", str(a.eval_every)])
    curve = []
    with open(metrics) as f:
        for line in f:
            r = json.loads(line)
            if r.get("kind") in ("eval", "epoch"):
                curve.append({"step": r["step"], "elapsed_s": r["elapsed_s"],
                              "val_loss": r["test_loss"]})
    return curve


def first_reach(curve, target):
    return next((c["elapsed_s"] for c in curve if c["val_loss"] <= target), None)


def cmd_curve(a):
    tmp = os.path.join(ROOT, "runs", "gpt_compare")
    os.makedirs(tmp, exist_ok=True)
    results = []
    for seed in [int(s) for s in a.seeds.split(",") if s]:
        for precision in cohort_precisions(a.cohort):
            curve = cohort_curve(a, seed, precision, tmp)
            results.append({"who": "cohort", "seed": seed, "precision": precision,
                            "curve": curve})
            print(f"cohort {precision} seed {seed}: val loss {curve[-1]['val_loss']:.4f} after "
                  f"{curve[-1]['elapsed_s']:.1f} s; {a.target} first at "
                  f"{first_reach(curve, a.target)} s", flush=True)
        if a.peer:
            for bf16 in [p == "bf16" for p in peer_precisions(a)]:
                cmd = ["/usr/bin/python3", PEER, "train", "--text", os.path.join(TEXT, "input.txt"),
                       "--seed", str(seed), "--threads", "2", "--eval-every",
                       str(a.eval_every)] + (["--bf16"] if bf16 else [])
                out = peer_compare.run(cmd, capture=True, timeout=3600)
                r = json.loads([l for l in out.splitlines() if l.startswith("RESULT ")][-1][7:])
                results.append({"who": "PyTorch", "seed": seed,
                                "precision": "bf16" if bf16 else "f32", "curve": r["curve"]})
                print(f"PyTorch {'bf16' if bf16 else 'f32'} seed {seed}: val loss "
                      f"{r['val_loss']:.4f} after {r['train_seconds']:.1f} s; {a.target} first at "
                      f"{first_reach(r['curve'], a.target)} s", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
    for path in filter(None, a.merge.split(",")):  # a run already here is not counted twice
        seen = {(r["who"], r["precision"], r["seed"]) for r in results}
        with open(path) as f:
            results += [r for r in json.load(f)
                        if (r["who"], r["precision"], r["seed"]) not in seen]
    print_spread(results, a.target)
    if a.svg:
        write_svg(results, a.svg, a.title)


def print_spread(results, target):
    """Per side and precision, over the seeds run (and merged): the final validation losses'
    mean and standard deviation, and at how many seeds the run ends at or under the target."""
    for key in dict.fromkeys((r["who"], r["precision"]) for r in results):
        runs = sorted((r for r in results if (r["who"], r["precision"]) == key),
                      key=lambda r: r["seed"])
        final = [r["curve"][-1]["val_loss"] for r in runs]
        sd = statistics.stdev(final) if len(final) > 1 else 0.0
        under = [r["seed"] for r, v in zip(runs, final) if v <= target]
        print(f"{key[0]} {key[1]}, seeds {[r['seed'] for r in runs]}: final val loss mean "
              f"{statistics.fmean(final):.4f}, sd {sd:.4f}; at or under {target} at "
              f"{len(under)} of {len(final)} (seeds {under})", flush=True)


def write_svg(results, path, title):
    """The curves (validation loss against training seconds) as one SVG, by hand: no plotting
    library is needed."""
    W, H, L, R, T, B = 760, 420, 60, 170, 40, 50
    pts = [(c["elapsed_s"], c["val_loss"]) for r in results for c in r["curve"]]
    x_max = max(x for x, _ in pts) * 1.05
    y_min, y_max = min(y for _, y in pts) - 0.05, max(y for _, y in pts) + 0.05
    sx = lambda x: L + (W - L - R) * x / x_max  # noqa: E731
    sy = lambda y: T + (H - T - B) * (y_max - y) / (y_max - y_min)  # noqa: E731
    colors = {("cohort", "f32"): "#1f77b4", ("cohort", "bf16"): "#17becf",
              ("PyTorch", "f32"): "#d62728", ("PyTorch", "bf16"): "#ff7f0e"}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
           f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
           f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">training seconds '
           '(steps only)</text>',
           f'<text x="15" y="{(T + H - B) / 2}" transform="rotate(-90 15 {(T + H - B) / 2})" '
           'text-anchor="middle">validation loss (whole split, nats/char)</text>']
    for i in range(6):
        x = x_max * i / 5
        out.append(f'<text x="{sx(x)}" y="{H - B + 16}" text-anchor="middle">{x:.0f}</text>')
        y = y_min + (y_max - y_min) * i / 5
        out.append(f'<text x="{L - 6}" y="{sy(y) + 4}" text-anchor="end">{y:.2f}</text>')
        out.append(f'<line x1="{L}" y1="{sy(y)}" x2="{W - R}" y2="{sy(y)}" stroke="#ddd"/>')
    seen = []
    for r in results:
        key = (r["who"], r["precision"])
        color = colors.get(key, "gray")
        path_d = " ".join(f'{"M" if i == 0 else "L"}{sx(c["elapsed_s"]):.1f},'
                          f'{sy(c["val_loss"]):.1f}' for i, c in enumerate(r["curve"]))
        out.append(f'<path d="{path_d}" fill="none" stroke="{color}" stroke-width="2"/>')
        if key not in seen:
            seen.append(key)
            y = T + 20 * len(seen)
            out.append(f'<line x1="{W - R + 10}" y1="{y}" x2="{W - R + 35}" y2="{y}" '
                       f'stroke="{color}" stroke-width="2"/>')
            out.append(f'<text x="{W - R + 40}" y="{y + 4}">{key[0]} {key[1]}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cmd", choices=["tput", "curve"])
    p.add_argument("--cohort", default=os.path.join(ROOT, "build", "release", "cohort"))
    p.add_argument("--cases", default="cpu,medium,full")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--baseline", default="",
                   help="tput: another cohort binary, run before this one in each round "
                        "(prints the per-round ratios)")
    p.add_argument("--peer-precisions", default="f32,bf16",
                   help="the peer's runs (f32 alone where its bf16 autocast is emulated, "
                        "as on CPUs without AVX512_BF16, and slower than its f32)")
    p.add_argument("--peer", action="store_true")
    p.add_argument("--target", type=float, default=1.90)
    p.add_argument("--eval-every", type=int, default=250,
                   help="curve: both sides' validation loss every this many iterations (the "
                        "recipe's 250; fewer place the first reach of --target more finely)")
    p.add_argument("--out", default="")
    p.add_argument("--merge", default="",
                   help="curve: also count these --out files' runs (comma-separated) in the "
                        "spread printed at the end")
    p.add_argument("--svg", default="", help="curve: also draw the curves into this SVG")
    p.add_argument("--title", default="nanoGPT's CPU recipe on Tiny Shakespeare")
    a = p.parse_args()
    {"tput": cmd_tput, "curve": cmd_curve}[a.cmd](a)


if __name__ == "__main__":
    main()
