#!/usr/bin/env python3
"""The reduction benchmark in one command: every reduce strategy of cohort beside a ring
all-reduce over threads (as PyTorch DDP, Horovod and gloo run it) and, under mpirun, beside
MPI_Allreduce and MPI_Reduce_scatter_block + MPI_Allgather, at powers of two from 1 KiB to
256 MiB and at each preset model's f32 gradient. Writes a table to stdout, the results as JSON
and a plot (matplotlib: bandwidth against size, one line per strategy, one panel per thread or
rank count); with --markdown, the results page (docs/reduce_results.md).

All timing happens in the C++ binaries: bench/reduce_bench (Google Benchmark, in one process)
and bench/reduce_mpi_bench (under mpirun, a fixed iteration count per size on every rank). Each
checks every sum against a float64 serial sum; a wrong sum makes this command exit 1.

  cmake --preset release && cmake --build --preset release --target reduce_bench reduce_mpi_bench
  python3 bench/run_reduce_bench.py --out build/reduce_results
  python3 bench/run_reduce_bench.py --out build/reduce_results --markdown docs/reduce_results.md

Bytes: each step sums L leaves of N floats (L = 2 per thread or rank). stream GB/s counts
L*N*4 read + N*4 written, as the ceiling (the same sum by the same thread team with the same
kernel, no synchronisation) does: stream_ratio = a case's stream GB/s over the ceiling's, measured
right before it. algbw = N*4 / step time; busbw = algbw x 2 (n-1) / n for n participants, as
NCCL's tests count an all-reduce.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys

KIB, MIB = 1024, 1024 * 1024
POWERS = [KIB << k for k in range(19)]  # 1 KiB .. 256 MiB
# Each preset's f32 gradient: parameters x 4 bytes (cohort train --dry-run prints the counts;
# the GPT counts follow nanoGPT's layout without biases: V*C + T*C + L*(12*C^2 + 2*C) + C).
MODELS = {
    "mlp:784-512-256-10": 535_818,
    "cnn": 317_066,
    "resnet20": 272_186,
    "gpt:4-4-128-64 (nanoGPT CPU recipe)": 804_096,
    "gpt:6-6-384-256 (nanoGPT recipe)": 10_745_088,
    "gpt:12-12-768-1024 (GPT-2 124M)": 50257 * 768 + 1024 * 768 + 12 * (12 * 768 ** 2 + 2 * 768) + 768,
}
# name in the binaries -> (shown name, bitwise the same result for every thread or rank count)
STRATEGIES = {
    "Baseline": ("ceiling", None),  # not a reduction: the bandwidth bound
    "Tree": ("tree", True),
    "TreeBinary": ("tree (binary)", True),
    "ChunkOwner": ("chunk owner", True),
    "ParameterServer": ("parameter server", True),
    "Serial": ("serial", True),
    "Mutex": ("mutex", False),
    "Atomic": ("atomic", False),
    "Ring": ("ring all-reduce", False),
    "cohort": ("cohort exchange", True),
    "mpi_allreduce": ("MPI_Allreduce", False),
    "mpi_rs_ag": ("MPI_Reduce_scatter_block + MPI_Allgather", False),
}
NAME = re.compile(r"^BM_Reduce_(\w+)/bytes:(\d+)/threads:(\d+)")
MPIRUN = ["mpirun", "--oversubscribe", "--mca", "btl_vader_single_copy_mechanism", "none"]
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def size_label(n):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n / MIB:.2f} MiB" if n >= MIB else f"{n / KIB:.1f} KiB"


def time_label(s):
    if s < 1e-3:
        return f"{s * 1e6:.2f} µs"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def machine():
    info = {}
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        info = {k.strip(): v.strip() for k, v in
                (line.split(":", 1) for line in text.splitlines() if ":" in line)}
    except (OSError, subprocess.CalledProcessError):
        pass
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        commit = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        commit += " (with uncommitted changes)" if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {"cpu": info.get("Model name", platform.processor() or "unknown"),
            "family": info.get("CPU family", "?"), "model": info.get("Model", "?"),
            "cores": os.cpu_count(), "l2": cache_size(2),
            "commit": commit,
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}


def cache_size(level):
    """A core's cache of `level` as the system reports it (lscpu may not), e.g. '1024K'."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for index in sorted(os.listdir(base)):
            with open(os.path.join(base, index, "level")) as f:
                if f.read().strip() != str(level):
                    continue
            with open(os.path.join(base, index, "type")) as f:
                if f.read().strip() == "Instruction":
                    continue
            with open(os.path.join(base, index, "size")) as f:
                return f.read().strip()
    except OSError:
        pass
    return "unknown"


def progress(text):
    sys.stderr.write("\r\033[K" + text if sys.stderr.isatty() else text + "\n")
    sys.stderr.flush()


def record(where, n, strategy, nbytes, seconds, leaves, extra=None):
    """One result: the step's seconds (median, min, max) and the bandwidths they give."""
    shown, reproducible = STRATEGIES[strategy]
    med = statistics.median(seconds)
    algbw = nbytes / med / 1e9
    r = {"where": where, "participants": n, "strategy": shown, "reproducible": reproducible,
         "bytes": nbytes, "leaves": leaves, "seconds_median": med, "seconds_min": min(seconds),
         "seconds_max": max(seconds), "repetitions": len(seconds), "algbw_GBps": algbw,
         "busbw_GBps": algbw * 2 * (n - 1) / n,
         "stream_GBps": (leaves * nbytes + nbytes) / med / 1e9, "correct": True}
    r.update(extra or {})
    return r


def run_threads(bench, sizes, threads, repetitions, min_time, out_dir):
    """reduce_bench over every size and thread count; returns (command, results, wrong)."""
    out_json = os.path.join(out_dir, "reduce_bench.json")
    cmd = [bench, "--reduce_sizes=" + ",".join(map(str, sizes)),
           "--reduce_threads=" + ",".join(map(str, threads)),
           f"--benchmark_repetitions={repetitions}", f"--benchmark_min_time={min_time}",
           "--benchmark_out_format=json", "--benchmark_out=" + out_json]
    total = (len(sizes) * len(threads) * (len(STRATEGIES) - 3) + len(threads)) * repetitions
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    done = 0
    for line in proc.stdout:
        if line.startswith("BM_Reduce_") and "_mean" not in line and "_median" not in line \
                and "_stddev" not in line and "_cv" not in line:
            done += 1
            progress(f"[{done}/{total}] {line.split()[0]}")
    proc.wait()
    with open(out_json) as f:
        data = json.load(f)
    reps = {}
    wrong = []
    for b in data["benchmarks"]:
        m = NAME.match(b["name"])
        if not m or b.get("run_type") == "aggregate":
            continue
        key = (m.group(1), int(m.group(2)), int(m.group(3)))
        if b.get("error_occurred"):
            wrong.append(f"{b['name']}: {b.get('error_message')}")
            continue
        reps.setdefault(key, []).append(b)
    results = []
    for (what, nbytes, t), runs in sorted(reps.items()):
        if what == "Handoff":
            seconds = [r["real_time"] * {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1}[r["time_unit"]]
                       for r in runs]
            results.append({"where": "threads", "participants": t, "strategy": "empty handoff",
                            "reproducible": True, "bytes": 0, "leaves": 0,
                            "seconds_median": statistics.median(seconds),
                            "seconds_min": min(seconds), "seconds_max": max(seconds),
                            "repetitions": len(seconds), "correct": True})
            continue
        scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1}
        seconds = [r["real_time"] * scale[r["time_unit"]] for r in runs]
        ratios = [r["stream_ratio"] for r in runs if "stream_ratio" in r]
        extra = {"stream_ratio": statistics.median(ratios)} if ratios and what != "Baseline" else {}
        results.append(record("threads", t, what, nbytes, seconds, int(runs[0]["leaves"]), extra))
    if proc.returncode not in (0, 1):
        raise SystemExit(f"run_reduce_bench: {shlex.join(cmd)} exited {proc.returncode}")
    if proc.returncode == 1 and not wrong:
        wrong.append(f"{bench} exited 1")
    return cmd, results, wrong


def run_ranks(mpi_bench, sizes, ranks, rank_leaves, repetitions):
    """reduce_mpi_bench under mpirun, one launch a size (its iteration count fixed for every rank);
    returns (one command as an example, results, wrong)."""
    results, wrong, example = [], [], None
    env = dict(os.environ, **MPI_ENV)
    for r, per in ((r, per) for r in ranks for per in rank_leaves):
        for i, nbytes in enumerate(sizes):
            iters = max(3, min(1000, (64 * MIB) // nbytes))
            cmd = MPIRUN + ["-np", str(r), mpi_bench, f"--sizes={nbytes}", f"--iters={iters}",
                            f"--reps={repetitions}", f"--leaves-per-rank={per}"]
            example = example or cmd
            progress(f"[{i + 1}/{len(sizes)}] {r} ranks, {per} leaves a rank, {size_label(nbytes)}")
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
            if proc.returncode not in (0, 1):
                raise SystemExit(f"run_reduce_bench: {shlex.join(cmd)} exited {proc.returncode}\n"
                                 f"{proc.stderr[-2000:]}")
            for line in proc.stdout.splitlines():
                if not line.startswith("{"):
                    continue
                j = json.loads(line)
                seconds = [j["seconds_median"], j["seconds_min"], j["seconds_max"]]
                res = record("ranks", j["ranks"], j["strategy"], j["bytes"], seconds, j["leaves"],
                             {"iters": j["iters"], "repetitions": j["reps"]})
                res["seconds_median"], res["seconds_min"], res["seconds_max"] = seconds
                res["correct"] = j["correct"]
                if not j["correct"]:
                    wrong.append(f"{j['strategy']}, {r} ranks, {nbytes} bytes: {j.get('error')}")
                results.append(res)
    return example, results, wrong


ORDER = [shown for shown, _ in STRATEGIES.values()]


def panel(r):
    """A result's panel: (where, participants, leaves a participant)."""
    return r["where"], r["participants"], r["leaves"] // max(1, r["participants"])


def panels_of(results):
    """The panels of the results with bytes, threads first."""
    return sorted({panel(r) for r in results if r["bytes"] > 0},
                  key=lambda p: (p[0] != "threads", p[1], p[2]))


def panel_title(where, n, per):
    if where == "threads":
        return f"{n} thread{'s' if n > 1 else ''}"
    return f"{n} ranks, {per} lea{'ves' if per > 1 else 'f'} a rank"


def names_of(rows):
    return sorted({r["strategy"] for r in rows}, key=ORDER.index)


def tables(results, size_names):
    """Markdown tables: one a thread or rank count, rows by size, a column a strategy (algbw
    GB/s; in one process, the stream ratio to the ceiling in parentheses; at sizes up to 16 KiB
    also the step's time)."""
    out = []
    for where, n, per in panels_of(results):
        rows = [r for r in results if panel(r) == (where, n, per) and r["bytes"]]
        names = names_of(rows)
        out.append(f"\n{panel_title(where, n, per)}: algbw GB/s"
                   + (" (stream ratio to the ceiling)" if where == "threads" else "")
                   + "; the step's time up to 16 KiB\n")
        out.append("| size | " + " | ".join(names) + " |")
        out.append("|" + "---|" * (len(names) + 1))
        for nbytes in sorted({r["bytes"] for r in rows}):
            cells = []
            for name in names:
                r = next((x for x in rows if x["bytes"] == nbytes and x["strategy"] == name), None)
                if r is None:
                    cells.append("–")
                    continue
                cell = f"{r['algbw_GBps']:.2f}"
                if "stream_ratio" in r:
                    cell += f" ({r['stream_ratio']:.2f})"
                if nbytes <= 16 * KIB:
                    cell += f", {time_label(r['seconds_median'])}"
                cells.append(cell)
            label = size_names.get(nbytes, size_label(nbytes))
            out.append(f"| {label} | " + " | ".join(cells) + " |")
        for r in results:
            if r["strategy"] == "empty handoff" and (r["where"], r["participants"]) == (where, n):
                out.append(f"\nEmpty handoff (the synchronisation floor): "
                           f"{time_label(r['seconds_median'])} a step.")
    return "\n".join(out)


def reproducibility_table(results):
    seen = {}
    for r in sorted((r for r in results if r["bytes"] > 0), key=lambda r: ORDER.index(r["strategy"])):
        seen.setdefault(r["strategy"], (r["where"], r["reproducible"]))
    lines = ["| strategy | where | bitwise the same for every thread or rank count |",
             "|---|---|---|"]
    for name, (where, rep) in seen.items():
        if rep is not None:
            lines.append(f"| {name} | {'one process' if where == 'threads' else 'MPI ranks'} | "
                         f"{'yes' if rep else 'no'} |")
    return "\n".join(lines)


def plot(results, size_names, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = panels_of(results)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.6), squeeze=False,
                             sharey=True)
    for ax, (where, n, per) in zip(axes[0], panels):
        rows = [r for r in results if panel(r) == (where, n, per) and r["bytes"]]
        for name in names_of(rows):
            pts = sorted((r["bytes"], r["algbw_GBps"]) for r in rows if r["strategy"] == name)
            style = {"linestyle": "--", "color": "black"} if name == "ceiling" else {}
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=name, **style)
        for nbytes, label in size_names.items():
            ax.axvline(nbytes, color="#ddd", linewidth=0.8, zorder=0)
        ax.set_xscale("log", base=2)
        ticks = [KIB << k for k in range(0, 21, 4)]
        ax.set_xticks(ticks, [size_label(t).replace(" ", "") for t in ticks])
        ax.set_yscale("log")
        ax.set_title(panel_title(where, n, per))
        ax.set_xlabel("gradient size (bytes; grey: the presets' gradients)")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("algbw GB/s (gradient bytes / step time)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def targets(results):
    """The results against the reduction targets (2 threads, 2 ranks): lines for the page."""
    def get(where, n, strategy, nbytes, per=2):
        return next((r for r in results if panel(r) == (where, n, per) and
                     (r["strategy"], r["bytes"]) == (strategy, nbytes)), None)
    lines = []
    sizes = sorted({r["bytes"] for r in results if r["where"] == "threads" and r["bytes"]})
    beat = [s for s in sizes if s >= 64 * KIB and s in POWERS and get("threads", 2, "tree", s)
            and get("threads", 2, "ring all-reduce", s)
            and get("threads", 2, "tree", s)["seconds_median"]
            <= get("threads", 2, "ring all-reduce", s)["seconds_median"]]
    checked = [s for s in sizes if s >= 64 * KIB and s in POWERS and get("threads", 2, "tree", s)]
    if checked:
        lines.append(f"- Tree at least as fast as the ring (2 threads, 64 KiB up): at {len(beat)} "
                     f"of {len(checked)} sizes.")
    ratios = [(s, get("threads", 2, "tree", s).get("stream_ratio")) for s in checked
              if s >= 2 * MIB]
    if ratios:
        worst = min(ratios, key=lambda x: x[1])
        lines.append(f"- Tree's stream ratio to the ceiling from 2 MiB (2 threads): at least "
                     f"{worst[1]:.2f} (at {size_label(worst[0])}).")
    one = get("threads", 2, "tree", KIB)
    if one:
        lines.append(f"- Tree at 1 KiB (2 threads): {time_label(one['seconds_median'])} a step.")
    ranks = sorted({r["bytes"] for r in results if r["where"] == "ranks"})
    for per, what in ((1, "the same bytes on the wire"), (2, "each leaf's slice sent")):
        pairs = [(s, get("ranks", 2, "cohort exchange", s, per),
                  get("ranks", 2, "MPI_Allreduce", s, per)) for s in ranks]
        pairs = [(s, a["busbw_GBps"] / b["busbw_GBps"]) for s, a, b in pairs if a and b]
        big = [p for p in pairs if p[0] >= 64 * KIB]
        if big:
            low = min(big, key=lambda x: x[1])
            lines.append(f"- Cohort's exchange over MPI_Allreduce's bus bandwidth, 2 ranks, {per} "
                         f"lea{'ves' if per > 1 else 'f'} a rank ({what}), 64 KiB up: "
                         f"{low[1]:.2f}x (at {size_label(low[0])}) to {max(p[1] for p in big):.2f}x; "
                         f"at least 0.9x at {sum(p[1] >= 0.9 for p in big)} of {len(big)} sizes.")
    return [l for l in lines if l]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    build = os.path.join(os.path.dirname(here), "build", "release", "bench")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", default=os.path.join(build, "reduce_bench"))
    ap.add_argument("--mpi-bench", default=os.path.join(build, "reduce_mpi_bench"),
                    help="'' to skip the ranks' part")
    ap.add_argument("--out", default="reduce_results", help="folder for the JSON and the plot")
    ap.add_argument("--threads", default="1,2,4", help="thread counts in one process")
    ap.add_argument("--ranks", default="2", help="rank counts under mpirun ('' none)")
    ap.add_argument("--rank-leaves", default="1,2",
                    help="leaves a rank under mpirun: 1 sends the all-reduce's bytes, 2 each of "
                         "two leaves' slices as the sharded root does for two workers")
    ap.add_argument("--sizes", default="",
                    help="bytes, comma-separated (default: powers of two 1 KiB..256 MiB)")
    ap.add_argument("--no-models", action="store_true", help="leave out the presets' sizes")
    ap.add_argument("--repetitions", type=int, default=5, help="repetitions a case (medians)")
    ap.add_argument("--min-time", default="0.1", help="seconds a repetition, in one process")
    ap.add_argument("--markdown", help="also write the results page here (its plot beside it)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s] or list(POWERS)
    size_names = {}
    if not args.no_models:
        for name, params in MODELS.items():
            size_names[params * 4] = name
        sizes = sorted(set(sizes) | set(size_names))
    os.makedirs(args.out, exist_ok=True)
    info = machine()
    command = [sys.executable, os.path.relpath(__file__)] + sys.argv[1:]
    threads = [int(t) for t in args.threads.split(",") if t]
    ranks = [int(r) for r in args.ranks.split(",") if r]
    commands, results, wrong = [], [], []
    if threads:
        cmd, res, bad = run_threads(args.bench, sizes, threads, args.repetitions, args.min_time,
                                    args.out)
        commands.append(cmd)
        results += res
        wrong += bad
    if ranks and args.mpi_bench:
        rank_leaves = [int(k) for k in args.rank_leaves.split(",") if k]
        cmd, res, bad = run_ranks(args.mpi_bench, sizes, ranks, rank_leaves, args.repetitions)
        commands.append(cmd)
        results += res
        wrong += bad
    progress("done")
    doc = {"machine": info, "command": shlex.join(command),
           "binaries": [shlex.join(c) for c in commands],
           "sizes": {str(k): v for k, v in size_names.items()}, "results": results}
    with open(os.path.join(args.out, "reduce_results.json"), "w") as f:
        json.dump(doc, f, indent=1)
    png = os.path.join(args.out, "reduce_results.png")
    plot(results, size_names, png)
    header = (f"{info['cpu']} (family {info['family']} model {info['model']}), {info['cores']} "
              f"cores, L2 {info['l2']}; commit {info['commit']}; {info['date']}")
    body = [header, "", reproducibility_table(results), tables(results, size_names), ""]
    body += targets(results)
    print("\n".join(body))
    print(f"\nwrote {os.path.join(args.out, 'reduce_results.json')} and {png}")
    if args.markdown:
        page_png = os.path.splitext(args.markdown)[0] + ".png"
        plot(results, size_names, page_png)
        page = ["# Reduction strategies: results", "",
                "Written by `bench/run_reduce_bench.py` (its docstring defines every figure):", "",
                "    " + shlex.join(command), "",
                f"Machine: {header}.", "",
                "Each figure is the median of the repetitions; the JSON beside the command's "
                "output has the minimum and maximum of each.", "",
                "## Targets (2 threads, 2 ranks)", ""] + targets(results) + [
                "", "## Which strategies reproduce their bits", "", reproducibility_table(results),
                "", "## Results", tables(results, size_names), "",
                f"![algbw against size]({os.path.basename(page_png)})", ""]
        with open(args.markdown, "w") as f:
            f.write("\n".join(page))
        print(f"wrote {args.markdown} and {page_png}")
    if wrong:
        for w in wrong:
            print("run_reduce_bench: wrong sum: " + w, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
