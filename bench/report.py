#!/usr/bin/python3
"""Measures this machine: cohort against its PyTorch peer (bench/peers/torch_peer.py) on the
standard comparison set, printed as the Markdown of one CPU's section of docs/benchmarks.md.

Usage: bench/report.py [--quick] [--reps N] [--cohort build/release/cohort] [--timeout 300]

It prints the CPU (model name, family and model, AVX2 / AVX-512 / AVX512_BF16 / AMX from
/proc/cpuinfo, or lscpu), oneDNN's dispatched ISA and cohort's bf16 support (`cohort --version`),
PyTorch's version and the commit (`git rev-parse --short HEAD`, "-dirty" when tracked files
differ from it), then two tables, each headed by the commit and the command that regenerates it:
  - samples/s of cohort (2 workers, --precision f32 and bf16) and PyTorch (2 threads, f32 and bf16
    autocast) on the MLP 784-512-256-10 at batch 256 and 32, the `cnn` preset at batch 256 and
    `resnet20` at batch 256, with cohort's bf16 / f32 and cohort bf16 / PyTorch's best of its two;
  - cohort's roofline fraction (its summary's `roofline.fraction`: the step's floor, measured on
    this machine, over the measured step) per point and precision.
cohort's bf16 runs only where `cohort --version` says "bf16 native" (the CPU has AVX512_BF16);
elsewhere its column reads "–" and the ratio against PyTorch is cohort f32's.

Every point alternates its runs (bench/peer_compare.py's precision_point) for --reps rounds
and reports medians: a machine's load drifts over minutes, so only figures measured side by side
in one run are compared. Steps per run: MLP b256 1000, MLP b32 3000, cnn 150, resnet20 20; with
the default --reps 5 that is roughly 10-15 minutes on 2 cores, most of it PyTorch's f32 `cnn` and
`resnet20`. --quick: MLP b256 100, MLP b32 300, cnn 15, no resnet20 (about 20 s a round on 2 Zen 5
cores, under 2 minutes at --reps 5); its figures carry more of each run's first step (cohort's
samples/s include it) and are for checking a setup, not for the page.
"""
import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

import peer_compare  # bench/, beside this script: the runners and the alternating loop

ROOT = peer_compare.ROOT
PYTHON = "/usr/bin/python3"

# (label, model as peer_compare takes it, batch, steps, steps under --quick; None: skipped)
POINTS = (
    ("MLP 784-512-256-10, batch 256", "mlp", 256, 1000, 100),
    ("MLP 784-512-256-10, batch 32", "mlp", 32, 3000, 300),
    ("`cnn`, batch 256", "cnn", 256, 150, 15),
    ("`resnet20`, batch 256", "resnet20", 256, 20, None),
)

# Server parts by (vendor, family, model): the microarchitecture named in a section's heading.
AMD_FAMILY_19 = ((0x00, 0x0F, "Zen 3"), (0x10, 0x1F, "Zen 4"), (0x20, 0x5F, "Zen 3"),
                 (0x60, 0x7F, "Zen 4"), (0xA0, 0xAF, "Zen 4"))
INTEL_FAMILY_6 = {85: "Skylake-SP / Cascade Lake", 106: "Ice Lake-SP", 108: "Ice Lake-SP",
                  143: "Sapphire Rapids", 207: "Emerald Rapids", 173: "Granite Rapids"}


def cpu_fields():
    """The first processor's fields of /proc/cpuinfo, else lscpu's, under cpuinfo's names."""
    try:
        with open("/proc/cpuinfo") as f:
            block = f.read().split("\n\n", 1)[0]
        fields = dict((k.strip(), v.strip()) for k, _, v in
                      (line.partition(":") for line in block.splitlines()))
        if "model name" in fields:
            return fields
    except OSError:
        pass
    names = {"Model name": "model name", "CPU family": "cpu family", "Model": "model",
             "Flags": "flags", "Vendor ID": "vendor_id"}
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return {names[k.strip()]: v.strip() for k, _, v in
            (line.partition(":") for line in out.splitlines()) if k.strip() in names}


def microarchitecture(vendor, family, model):
    if vendor == "AuthenticAMD" and family == 0x1A:
        return "Zen 5"
    if vendor == "AuthenticAMD" and family == 0x19:
        return next((name for lo, hi, name in AMD_FAMILY_19 if lo <= model <= hi), None)
    if vendor == "GenuineIntel" and family == 6:
        return INTEL_FAMILY_6.get(model)
    return None


def cpu():
    """A dict: name, family, model, microarchitecture (or None), logical CPUs and the ISA flags
    that decide cohort's and oneDNN's kernels."""
    f = cpu_fields()
    flags = set(f.get("flags", "").split())
    family, model = (int(f[k]) if f.get(k, "").isdigit() else None for k in ("cpu family", "model"))
    amx = sorted(x for x in flags if x.startswith("amx"))
    return {"name": f.get("model name", platform.processor() or "unknown"),
            "family": family, "model": model,
            "uarch": microarchitecture(f.get("vendor_id"), family, model),
            "cpus": os.cpu_count(),
            "isa": {"AVX2": "avx2" in flags, "AVX-512": "avx512f" in flags,
                    "AVX512_BF16": "avx512_bf16" in flags},
            "amx": amx}


def commit():
    """The short commit hash, "-dirty" when tracked files differ from it; "unknown" outside git."""
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    dirty = subprocess.run(["git", "-C", ROOT, "diff", "--quiet", "HEAD", "--"]).returncode != 0
    return head + ("-dirty" if dirty else "")


def torch_version():
    try:
        out = peer_compare.run([PYTHON, peer_compare.PEER, "info"], capture=True)
    except subprocess.CalledProcessError:
        raise SystemExit(f"{peer_compare.PEER} info failed: is PyTorch installed? "
                         "(scripts/setup.sh test; bench/peers/README.md)")
    return out.splitlines()[0].strip() if out else "unknown"


def number(x, fmt="{:,.0f}"):
    return "–" if x is None else fmt.format(x)


def ratio(x):
    return number(x, "**{:.2f}x**")


def measure(a, precisions):
    """Runs every point; returns one row per point: (label, steps, medians by label, roofline
    fraction medians by precision)."""
    rows = []
    for label, model, batch, steps, quick_steps in POINTS:
        n = quick_steps if a.quick else steps
        if n is None:
            continue
        start = time.perf_counter()
        print(f"report: {label}, {n} steps, {a.reps} rounds ...", file=sys.stderr, flush=True)
        med, _, kept = peer_compare.precision_point(label, model, batch, n, a.reps, precisions,
                                                    show=False)
        roof = {}
        for p in precisions:
            fr = peer_compare.roofline_fractions(kept[peer_compare.cohort_label(p)])
            roof[p] = statistics.median(fr) if fr else None
        print(f"report: {label} done in {time.perf_counter() - start:.0f} s", file=sys.stderr,
              flush=True)
        rows.append((label, n, med, roof))
    return rows


def print_report(a, c, version, torch, rev, rows, bf16):
    heading = c["name"] + (f": {c['uarch']}" if c["uarch"] else "")
    ident = f"family {c['family']}, model {c['model']}"
    yes = lambda v: "yes" if v else "no"
    command = "bench/report.py" + (" --quick" if a.quick else "") + f" --reps {a.reps}"
    rounds = "one round" if a.reps == 1 else f"the medians of {a.reps} rounds"
    head = (f"Commit `{rev}`; regenerate with `{command}`. Figures are {rounds}, each "
            f"alternating the runs of its row.")
    print(f"## {heading} ({ident})\n")
    print("| | |\n|---|---|")
    print(f"| CPU | {c['name']}, {ident}, {c['cpus']} logical CPUs |")
    print("| ISA | " + ", ".join(f"{k} {yes(v)}" for k, v in c["isa"].items()) +
          f", AMX {'yes (' + ', '.join(c['amx']) + ')' if c['amx'] else 'no'} |")
    print(f"| oneDNN | {version.get('oneDNN', '?')}, dispatch `{version.get('isa', '?')}` |")
    print(f"| cohort | {version.get('cohort', '?')}, bf16 {version.get('bf16', '?')}, "
          f"2 workers |")
    print(f"| PyTorch | {torch} (`bench/peers/torch_peer.py`), 2 threads |")
    print(f"| commit | `{rev}` |")

    F, B = peer_compare.cohort_label("f32"), peer_compare.cohort_label("bf16")
    TF, TB = peer_compare.PEER_F32, peer_compare.PEER_BF16
    print("\n### Samples/s: cohort 2 workers vs PyTorch 2 threads\n")
    print(head + " cohort's figure counts training steps, its first step included; PyTorch's "
          "excludes 20 warm-up steps.\n")
    best_col = "cohort bf16 / PyTorch's best" if bf16 else "cohort f32 / PyTorch's best"
    print(f"| point | steps | cohort f32 | cohort bf16 | PyTorch f32 | PyTorch bf16 (autocast) "
          f"| cohort bf16 / f32 | {best_col} |")
    print("|---|---|---|---|---|---|---|---|")
    for label, n, med, _ in rows:
        ours = med.get(B, med[F])
        print(f"| {label} | {n} | {number(med[F])} | {number(med.get(B))} | {number(med[TF])} "
              f"| {number(med[TB])} | {ratio(med[B] / med[F] if B in med else None)} "
              f"| {ratio(ours / max(med[TF], med[TB]))} |")
    if not bf16:
        print(f"\ncohort's bf16 is not measured here: `cohort --version` says bf16 "
              f"{version.get('bf16', '?')} (no AVX512_BF16).")

    print("\n### Roofline fraction (the summary's `roofline.fraction`: floor / measured step)\n")
    print(head + "\n")
    print("| point | f32 | bf16 |\n|---|---|---|")
    for label, _, _, roof in rows:
        print(f"| {label} | {number(roof.get('f32'), '{:.2f}')} "
              f"| {number(roof.get('bf16'), '{:.2f}')} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="few steps, no resnet20 (~2 minutes)")
    p.add_argument("--reps", type=int, default=5, help="rounds per point")
    p.add_argument("--cohort", default=peer_compare.COHORT, help="the cohort binary to measure")
    p.add_argument("--timeout", type=float, default=peer_compare.TIMEOUT,
                   help="seconds per child process")
    a = p.parse_args()
    peer_compare.COHORT, peer_compare.TIMEOUT = a.cohort, a.timeout
    if not os.path.exists(a.cohort):
        raise SystemExit(f"{a.cohort} not found: build it first "
                         "(cmake --preset release && cmake --build --preset release)")
    start = time.perf_counter()
    c, version, rev = cpu(), peer_compare.cohort_version(), commit()
    torch = torch_version()
    bf16 = version.get("bf16") == "native"
    rows = measure(a, ("f32", "bf16") if bf16 else ("f32",))
    print_report(a, c, version, torch, rev, rows, bf16)
    print(f"report: {time.perf_counter() - start:.0f} s in all", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
