#!/usr/bin/env python3
"""Runs bench/reduce_bench and writes a Markdown table and an SVG plot of the results.

Two passes: a sweep (every strategy x size x threads, one repetition) and a headline pass (the
cases the done-when targets name, with --repetitions and medians). Standard library only; the
plot is written as SVG by hand (GB/s against gradient size, one line per strategy, one panel per
thread count). Not a benchmark harness of its own: all timing happens in the C++ binary.

Example:
  cmake -S . -B build/reduce -G Ninja -DCOHORT_ENGINE=OFF -DCMAKE_BUILD_TYPE=Release
  cmake --build build/reduce --target reduce_bench
  python3 bench/run_reduce_bench.py --bench build/reduce/bench/reduce_bench --out docs
"""
import argparse
import datetime
import json
import math
import os
import platform
import re
import subprocess
import sys

NAME = re.compile(r"^BM_Reduce_(\w+)/bytes:(\d+)/threads:(\d+)")
HEADLINE = r"(BM_Reduce_(Baseline|Tree|Atomic|Mutex)/bytes:(1024|2097152|67108864)/threads:2/)" \
           r"|(BM_Reduce_Handoff/bytes:0/threads:2/)"
ORDER = ["Baseline", "Tree", "TreeBinary", "ChunkOwner", "ParameterServer", "Mutex", "Atomic",
         "Serial"]
COLORS = {"Baseline": "#000000", "Tree": "#d62728", "TreeBinary": "#ff9896",
          "ChunkOwner": "#1f77b4", "ParameterServer": "#9467bd", "Mutex": "#2ca02c",
          "Atomic": "#8c564b", "Serial": "#7f7f7f"}


def run(bench, out_json, extra):
    cmd = [bench, "--benchmark_format=json", "--benchmark_out_format=json",
           "--benchmark_out=" + out_json] + extra
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(out_json) as f:
        return cmd, json.load(f)


def rows(data):
    """{(what, bytes, threads): entry}; medians when aggregates are present."""
    out = {}
    for b in data["benchmarks"]:
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        m = NAME.match(b["name"])
        if not m:
            continue
        key = (m.group(1), int(m.group(2)), int(m.group(3)))
        out[key] = b
    return out


def ns(entry):
    scale = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}[entry.get("time_unit", "ns")]
    return entry["real_time"] * scale


def size_label(n):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def time_label(t):
    if t < 1e3:
        return f"{t:.0f} ns"
    if t < 1e6:
        return f"{t / 1e3:.2f} µs"
    return f"{t / 1e6:.2f} ms"


def lscpu():
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown"
    info = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    get = lambda k: info.get(k, "?").strip()
    return (f"{get('Model name')}, {get('Core(s) per socket')} cores x {get('Socket(s)')} socket(s), "
            f"{get('Thread(s) per core')} thread(s)/core, L2 {get('L2 cache')}, L3 {get('L3 cache')}")


def table(res, with_time=False):
    whats = [w for w in ORDER if any(k[0] == w for k in res)]
    keys = sorted({(k[1], k[2]) for k in res if k[0] != "Handoff"})
    head = "| size | threads | " + " | ".join(whats) + " |"
    lines = [head, "|" + "---|" * (2 + len(whats))]
    for size, threads in keys:
        cells = []
        for w in whats:
            e = res.get((w, size, threads))
            if e is None:
                cells.append("–")
                continue
            gbs = e.get("bytes_per_second", 0) / 1e9
            cell = f"{gbs:.1f} GB/s"
            if "stream_ratio" in e and w != "Baseline":
                cell += f" ({e['stream_ratio']:.2f})"
            if with_time:
                cell += f", {time_label(ns(e))}"
            cells.append(cell)
        lines.append(f"| {size_label(size)} | {threads} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def svg_plot(res, path):
    threads_list = sorted({k[2] for k in res if k[0] != "Handoff"})
    sizes = sorted({k[1] for k in res if k[0] != "Handoff"})
    if not sizes:
        return
    whats = [w for w in ORDER if any(k[0] == w for k in res)]
    pw, ph, ml, mt, mb = 360, 300, 60, 40, 50
    width = ml + len(threads_list) * (pw + 30) + 170
    height = mt + ph + mb
    vals = [e["bytes_per_second"] / 1e9 for k, e in res.items()
            if k[0] != "Handoff" and e.get("bytes_per_second", 0) > 0]
    ymin = 10 ** math.floor(math.log10(min(vals)))
    ymax = 10 ** math.ceil(math.log10(max(vals)))
    xl = (math.log2(sizes[0]), math.log2(sizes[-1]) if len(sizes) > 1 else math.log2(sizes[0]) + 1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>']
    for p, threads in enumerate(threads_list):
        x0 = ml + p * (pw + 30)
        fx = lambda s: x0 + (math.log2(s) - xl[0]) / (xl[1] - xl[0]) * pw
        fy = lambda v: mt + ph - (math.log10(v) - math.log10(ymin)) / \
            (math.log10(ymax) - math.log10(ymin)) * ph
        out.append(f'<rect x="{x0}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>')
        out.append(f'<text x="{x0 + pw / 2}" y="{mt - 10}" text-anchor="middle" font-size="13">'
                   f'{threads} thread(s)</text>')
        e10 = math.log10(ymin)
        while e10 <= math.log10(ymax) + 1e-9:
            y = fy(10 ** e10)
            out.append(f'<line x1="{x0}" x2="{x0 + pw}" y1="{y}" y2="{y}" stroke="#eee"/>')
            if p == 0:
                out.append(f'<text x="{x0 - 5}" y="{y + 4}" text-anchor="end">{10 ** e10:g}</text>')
            e10 += 1
        for s in sizes:
            out.append(f'<text x="{fx(s)}" y="{mt + ph + 15}" text-anchor="middle" '
                       f'font-size="9">{size_label(s).replace(" ", "")}</text>')
        for w in whats:
            pts = [(fx(s), fy(res[(w, s, threads)]["bytes_per_second"] / 1e9)) for s in sizes
                   if (w, s, threads) in res and res[(w, s, threads)].get("bytes_per_second", 0) > 0]
            if len(pts) > 1:
                d = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
                dash = ' stroke-dasharray="5,3"' if w == "Baseline" else ""
                out.append(f'<polyline points="{d}" fill="none" stroke="{COLORS.get(w, "#333")}" '
                           f'stroke-width="2"{dash}/>')
    out.append(f'<text x="20" y="{mt + ph / 2}" transform="rotate(-90 20 {mt + ph / 2})" '
               f'text-anchor="middle">GB/s (L·N·4 read + N·4 written per step)</text>')
    out.append(f'<text x="{ml + len(threads_list) * (pw + 30) / 2}" y="{height - 10}" '
               f'text-anchor="middle">gradient size N·4 bytes (L = 2 × threads leaves)</text>')
    lx = ml + len(threads_list) * (pw + 30)
    for i, w in enumerate(whats):
        y = mt + 10 + i * 18
        out.append(f'<line x1="{lx}" x2="{lx + 25}" y1="{y}" y2="{y}" stroke="{COLORS.get(w)}" '
                   f'stroke-width="2"/><text x="{lx + 30}" y="{y + 4}">{w}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", default="build/reduce/bench/reduce_bench")
    ap.add_argument("--out", default="bench_out", help="output directory")
    ap.add_argument("--repetitions", type=int, default=7, help="headline repetitions (median)")
    ap.add_argument("--min-time", default="0.3", help="--benchmark_min_time of the sweep")
    ap.add_argument("--sweep-filter", default=".", help="--benchmark_filter of the sweep")
    ap.add_argument("--no-sweep", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    commands = []
    cmd, head = run(args.bench, os.path.join(args.out, "reduce_headline.json"),
                    ["--benchmark_filter=" + HEADLINE,
                     f"--benchmark_repetitions={args.repetitions}",
                     "--benchmark_report_aggregates_only=true"])
    commands.append(cmd)
    hres = rows(head)
    sres = {}
    if not args.no_sweep:
        cmd, sweep = run(args.bench, os.path.join(args.out, "reduce_sweep.json"),
                         ["--benchmark_filter=" + args.sweep_filter,
                          "--benchmark_min_time=" + args.min_time])
        commands.append(cmd)
        sres = rows(sweep)
        svg_plot(sres, os.path.join(args.out, "reduce_results.svg"))

    md = ["# reduce benchmark results", "",
          f"- machine: {lscpu()}",
          f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
          f"- context (Google Benchmark): {head['context'].get('num_cpus')} CPUs at {head['context'].get('mhz_per_cpu')} MHz, "
          f"load avg {head['context'].get('load_avg')}",
          "- commands:", ""]
    md += ["      " + " ".join(c) for c in commands]
    md += ["", "Bytes counted per step, for every case and the baseline: L·N·4 read + N·4 written,",
           "L = 2 × threads leaves. Cells: GB/s (stream_ratio = bytes/s over the same-size,",
           "same-threads baseline measured right before the case), and time per step.", "",
           f"## Headline (median of {args.repetitions} repetitions)", "",
           table(hres, with_time=True), ""]
    for (w, b, t), e in sorted(hres.items()):
        if w == "Handoff":
            md.append(f"Empty handoff (synchronisation floor), {t} threads: {time_label(ns(e))} "
                      "per step.")
    if sres:
        md += ["", "## Sweep (one repetition each)", "", table(sres), "",
               "Empty handoff per step: " + ", ".join(
                   f"{t} thread(s) {time_label(ns(e))}"
                   for (w, b, t), e in sorted(sres.items()) if w == "Handoff"),
               "", "![GB/s against size](reduce_results.svg)"]
    with open(os.path.join(args.out, "reduce_results.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("wrote", os.path.join(args.out, "reduce_results.md"))


if __name__ == "__main__":
    sys.exit(main())
