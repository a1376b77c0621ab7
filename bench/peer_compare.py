#!/usr/bin/python3
"""Side-by-side throughput of cohort and its PyTorch peer (bench/peers/torch_peer.py) on the
same model and batch, alternating A and B in one run and reporting medians and their ratio.

The machine is shared and noisy, so only ratios measured in the same run mean anything.
cohort's samples/s counts training steps only (its summary's `samples_per_second`: no data
loading, no evaluation; the first step, which creates the oneDNN primitives, is included). The
peer's figure is its `tput` median (20 warm-up steps excluded). --cases bf16 and resnet20 set
cohort's rate after its first step against the peer's (their targets' ratio) and print the rate
over the whole run beside it.

Usage: bench/peer_compare.py [--reps 5] [--steps 300] [--cases mlp256,mlp32,scaling,micro,wgrads,cnn,layouts]
       bench/peer_compare.py --cases versions --baseline OLD/cohort   (this build against another)
       bench/peer_compare.py --cases mpi [--mpirun mpirun] [--mpirun-args="..."]
                             (2 ranks x 1 worker vs 1 process x 2 workers vs PyTorch DDP)
       bench/peer_compare.py --cases resnet20 [--resnet20-steps 20]   (as bf16, for resnet20)
       bench/peer_compare.py --cases bf16 [--bf16-mlp-steps 300] [--bf16-cnn-steps 60]
                             [--bf16-mlp32-steps 1500]
                             (--precision f32 vs bf16, and PyTorch without and with --bf16, for
                             the MLP at batch 256, the cnn preset at 256 and the MLP at 32)
Every child runs in its own process group under --timeout seconds (default 300); on expiry the
whole group (mpirun and its ranks, DDP's spawned processes) is terminated and the script stops.
Needs: python3-torch and libopenblas0-openmp (`scripts/setup.sh test`; bench/peers/README.md),
build/release/cohort (--cohort another binary); for --cases mpi an MPI-enabled build and Open
MPI's mpirun. bench/report.py runs the standard set of these comparisons through its functions.
"""
import argparse
import itertools
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COHORT = os.path.join(ROOT, "build/release/cohort")
PEER = os.path.join(ROOT, "bench/peers/torch_peer.py")
TIMEOUT = 300  # seconds per child process (--timeout)
# Open MPI on this machine: oversubscribe the 2 cores, no cross-memory-attach single copy (the
# container forbids it), and as root the two variables set in mpi_env().
MPIRUN = "mpirun"
MPIRUN_ARGS = "--oversubscribe --mca btl_vader_single_copy_mechanism none"
MPI_RANKS = 2  # the mpi case is 2 ranks x 1 worker, as the peer's DDP is 2 processes x 1 thread
DDP_PORTS = itertools.count(29511)  # a fresh rendezvous port per DDP run: no TIME_WAIT clash


def cohort_version(binary=None):
    """`cohort --version` of binary (default COHORT) as a dict: "cohort" and "oneDNN" (versions),
    "isa" (oneDNN's dispatched ISA on this CPU), "bf16" (none, emulated or native: whether the CPU
    has AVX512_BF16)."""
    out = subprocess.run([binary or COHORT, "--version"], capture_output=True, text=True, check=True).stdout
    info = {}
    for line in out.splitlines():
        key, _, rest = line.partition(" ")
        if key == "CPU":  # "CPU avx512_core_bf16 (oneDNN's dispatch), bf16 native"
            info["isa"] = rest.split(" ", 1)[0]
            info["bf16"] = rest.rsplit(" ", 1)[-1]
        else:
            info[key] = rest
    return info


def bf16_none(binary=None):
    """Whether `cohort --version` says oneDNN has no bf16 kernels on this CPU (no AVX-512)."""
    return cohort_version(binary).get("bf16") == "none"


def run(cmd, env=None, capture=False, timeout=None):
    """Runs cmd in a process group of its own under `timeout` (default TIMEOUT); on expiry
    terminates the whole group (mpirun's ranks, DDP's spawned children) and raises. Returns stdout
    when capture is set. bench/precision_accuracy.py runs its children through it too."""
    timeout = TIMEOUT if timeout is None else timeout
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE if capture else None, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            try:
                p.communicate(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                pass
        raise SystemExit(f"timed out after {timeout} s: {shlex.join(cmd)}")
    if p.returncode:
        raise subprocess.CalledProcessError(p.returncode, cmd, out)
    return out


def mpi_env():
    env = dict(os.environ)
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def summary(args, steps, binary=None, launcher=(), env=None):
    """cohort train's summary JSON (rank 0 writes it under mpirun)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = list(launcher) + [binary or COHORT, "train", "--quiet", "--steps", str(steps),
                                "--summary", f.name] + args
        run(cmd, env)
        return json.load(open(f.name))


def cohort(args, steps, binary=None):
    s = summary(args, steps, binary)
    return s["samples_per_second"], s["time"]


def cohort_mpi(args, steps):
    """cohort train under mpirun -np MPI_RANKS; refuses a summary that is not one job of
    MPI_RANKS ranks (a build without MPI runs MPI_RANKS independent trainings instead)."""
    launcher = [MPIRUN] + shlex.split(MPIRUN_ARGS) + ["-np", str(MPI_RANKS)]
    s = summary(args, steps, launcher=launcher, env=mpi_env())
    if s.get("ranks") != MPI_RANKS:
        raise SystemExit(f"{COHORT} under mpirun -np {MPI_RANKS} wrote ranks = {s.get('ranks')} "
                         f"in its summary: is it built with MPI?")
    return s


def peer(args, steps, command="tput"):
    cmd = ["/usr/bin/python3", PEER, command, "--steps", str(steps), "--reps", "1"] + args
    out = run(cmd, capture=True)
    line = [l for l in out.splitlines() if l.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])["median"], None


def verdict(value, target):
    return f"target ≥ {target}: {'met' if value >= target else 'not met'}"


PEER_F32, PEER_BF16 = "torch f32", "torch --bf16"


def cohort_label(precision):
    return f"cohort --precision {precision}"


def precision_point(title, model, batch, steps, reps, precisions=("f32", "bf16"), show=True):
    """One model and batch: cohort --precision P for each of precisions (2 workers) and the peer
    without and with --bf16 (2 threads), alternating in each round, the same step count for all
    (cohort's rate includes its first step, the peer's excludes its 20 warm-up steps; bf16_point
    also sets cohort's rate after its first step against the peer's). Returns
    side_by_side's medians and per-round rates by label (cohort_label(P), PEER_F32, PEER_BF16) and
    cohort's summaries by label."""
    kept = {cohort_label(p): [] for p in precisions}
    flags = ["--model", "mlp:784-512-256-10" if model == "mlp" else model, "--batch", str(batch),
             "--workers", "2"]
    peer_flags = ["--model", model, "--threads", "2", "--batch", str(batch)]

    def keep(label, s):
        kept[label].append(s)
        return s["samples_per_second"], s["time"]

    def cohort_runner(p):
        return lambda s: keep(cohort_label(p), summary(flags + ["--precision", p], s))

    med, rates = side_by_side(
        f"{title}: cohort 2 workers {' / '.join(precisions)} vs PyTorch 2 threads f32 / bf16 "
        f"(autocast), {steps} steps",
        [(cohort_label(p), cohort_runner(p)) for p in precisions] +
        [(PEER_F32, lambda s: peer(peer_flags, s)),
         (PEER_BF16, lambda s: peer(peer_flags + ["--bf16"], s))],
        reps, steps, show)
    for p in precisions:
        got = {s.get("precision") for s in kept[cohort_label(p)]}
        if got != {p}:
            raise SystemExit(f"{COHORT} wrote precision {got} in its summary for "
                             f"{cohort_label(p)}: is it a build with --precision?")
    return med, rates, kept


def steady_rates(summaries):
    """cohort's samples/s after its first step in each summary (its batch over the mean step
    after the first, the roofline's step_seconds); empty unless every summary has one."""
    out = [s["batch"] / s["roofline"]["step_seconds"] for s in summaries
           if (s.get("roofline") or {}).get("step_seconds")]
    return out if len(out) == len(summaries) else []


def roofline_fractions(summaries):
    """The summaries' roofline fractions (floor / measured step), those that have one."""
    return [s["roofline"]["fraction"] for s in summaries if s.get("roofline")]


def bf16_point(title, model, batch, steps, reps, targets):
    """One point of --cases bf16 (precision_point, f32 and bf16). Prints the medians, the ratios
    and cohort's roofline fraction per precision; returns the target rows
    (point, what, value, target)."""
    F, B, TF, TB = cohort_label("f32"), cohort_label("bf16"), PEER_F32, PEER_BF16
    med, rates, kept = precision_point(f"bf16, {title}", model, batch, steps, reps)
    rows = []
    # Against PyTorch, cohort's rate after its first step: the peer's leaves out its warm-up
    # steps, and cohort's first step builds the plans (a 20-step resnet20 run's first step was a
    # quarter of its time). The rate over the whole run is printed beside it.
    steady = steady_rates(kept[B])
    best_torch = max(med[TF], med[TB])
    ratios = [("cohort bf16 / cohort f32", med[B] / med[F], "bf16/f32"),
              ("cohort bf16 over the run (its first step included) / torch's best",
               med[B] / best_torch, None)]
    if steady:
        ratios.append(("cohort bf16 after its first step / torch's best",
                       statistics.median(steady) / best_torch, "vs torch"))
    ratios.append(("torch bf16 / torch f32", med[TB] / med[TF], None))
    print()
    if steady:
        print(f"- cohort bf16 after its first step: {statistics.median(steady):,.0f} samples/s "
              f"({', '.join(f'{x:,.0f}' for x in steady)})")
    for what, r, key in ratios:
        target = targets.get(key)
        print(f"- {what}: **{r:.2f}x**" + (f" ({verdict(r, target)})" if target else ""))
        if target:
            rows.append((title, what, f"{r:.2f}x", f"≥ {target}x", r >= target))
    paired(rates, B, [F], "cohort bf16 / cohort f32")
    paired(rates, B, [TF, TB], "cohort bf16 over the run / the round's best torch")
    if steady:
        paired(dict(rates, steady=steady), "steady", [TF, TB],
               "cohort bf16 after its first step / the round's best torch")
    paired(rates, TB, [TF], "torch bf16 / torch f32")
    for label in (F, B):
        fr = roofline_fractions(kept[label])
        if not fr:
            print(f"- {label}: the summary has no roofline")
            continue
        m = statistics.median(fr)
        target = targets.get("roofline")
        print(f"- {label} roofline fraction: median **{m:.2f}** "
              f"({', '.join(f'{x:.2f}' for x in fr)})" + (f"; {verdict(m, target)}" if target else ""))
        if target:
            rows.append((title, f"roofline fraction, {label.split()[-1]}", f"{m:.2f}", f"≥ {target}",
                         m >= target))
    sys.stdout.flush()
    return rows


def bytes_fields(d, prefix=""):
    """Every numeric field of a summary whose name mentions bytes, as (dotted name, value)."""
    for k, v in d.items():
        if isinstance(v, dict):
            yield from bytes_fields(v, f"{prefix}{k}.")
        elif "bytes" in k and isinstance(v, (int, float)):
            yield prefix + k, v


def side_by_side(title, runners, reps, steps, show=True):
    """runners: list of (label, fn(steps) -> (samples/s, time)). Alternates them reps times;
    prints the rates as a table under `title` when show is set. Returns the medians and the
    per-round rates by label."""
    rates = {label: [] for label, _ in runners}
    shares = {label: [] for label, _ in runners}
    cpu = {label: [] for label, _ in runners}
    for _ in range(reps):
        for label, fn in runners:
            r, t = fn(steps)
            rates[label].append(r)
            if t and t.get("step"):
                # The root's wall share (sum + optimizer on the critical path; with batch weight
                # gradients it also holds the root's GEMMs), and the share of all workers' time
                # spent reducing and in the optimizer (the GEMMs count as compute).
                shares[label].append(t["reduce_critical"] / t["step"])
                cpu[label].append(t["reduce"] / (t["reduce"] + t["compute"] + t["data"] + t["idle"]))
    med = {label: statistics.median(rates[label]) for label, _ in runners}
    if not show:
        return med, rates
    print(f"\n### {title}\n")
    print("| run | samples/s (median) | all repetitions | root wall share of step (median) "
          "| reduce + optimizer share of worker time (median) |")
    print("|---|---|---|---|---|")
    for label, _ in runners:
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
    global COHORT, TIMEOUT, MPIRUN, MPIRUN_ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--cases", default="mlp256,mlp32,scaling,micro,wgrads,cnn,layouts")
    p.add_argument("--baseline", help="another cohort binary, for --cases versions")
    p.add_argument("--cohort", default=COHORT, help="the cohort binary to measure")
    p.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds per child process")
    p.add_argument("--bf16-mlp-steps", type=int, default=300,
                   help="--cases bf16: steps per run, MLP batch 256 (cohort and the peer)")
    p.add_argument("--bf16-cnn-steps", type=int, default=60,
                   help="--cases bf16: steps per run, cnn batch 256")
    p.add_argument("--bf16-mlp32-steps", type=int, default=1500,
                   help="--cases bf16: steps per run, MLP batch 32")
    p.add_argument("--resnet20-steps", type=int, default=20,
                   help="--cases resnet20: steps per run (cohort and the peer), batch 256")
    p.add_argument("--mpirun", default=MPIRUN, help="mpirun for --cases mpi")
    p.add_argument("--mpirun-args", default=MPIRUN_ARGS,
                   help='mpirun options before -np, one string: --mpirun-args="..." (--cases mpi)')
    a = p.parse_args()
    COHORT, TIMEOUT, MPIRUN, MPIRUN_ARGS = a.cohort, a.timeout, a.mpirun, a.mpirun_args
    cases = a.cases.split(",")
    print(f"reps {a.reps}, steps {a.steps}, cohort {COHORT}")
    if "bf16" in cases:
        print(f"bf16 case: steps {a.bf16_mlp_steps} (MLP b256), {a.bf16_cnn_steps} (cnn b256), "
              f"{a.bf16_mlp32_steps} (MLP b32)")
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
        # alternating: the MLP at batch 256 and the cnn preset, 2 workers, f32 and bf16.
        # Without bf16 kernels here (`cohort --version`: "bf16 none"), f32 only.
        precisions = ("f32",) if bf16_none() else ("f32", "bf16")
        for title, flags, steps in tuple(
                (f"MLP batch 256, {p}", ["--workers", "2", "--precision", p], a.steps)
                for p in precisions) + tuple(
                (f"cnn, batch 256, {p}", ["--model", "cnn", "--workers", "2", "--precision", p],
                 a.steps // 4) for p in precisions):
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
    if "mpi" in cases:
        # The default MLP at batch 256 with the micro-batch pinned to 128 (one leaf per worker in
        # both layouts, the single process's default on 2 cores), so (a) and (b) run the same
        # leaf tree and must end on the same weights digest. The same --steps for all three;
        # cohort's rate includes its first step, DDP's excludes its 20 warm-up steps.
        mlp = ["--model", "mlp:784-512-256-10", "--batch", "256", "--micro-batch", "128"]
        A = f"(a) cohort mpirun -np {MPI_RANKS} --workers 1"
        B = "(b) cohort --workers 2"
        C = "(c) torch ddp 2 procs x 1 thread"
        kept = {A: [], B: []}

        def keep(label, s):
            kept[label].append(s)
            return s["samples_per_second"], s["time"]

        med, rates = side_by_side(
            f"MPI, MLP batch 256: cohort {MPI_RANKS} ranks x 1 worker vs 1 process x 2 workers "
            f"vs PyTorch DDP (gloo)",
            [(A, lambda s: keep(A, cohort_mpi(mlp + ["--workers", "1"], s))),
             (B, lambda s: keep(B, summary(mlp + ["--workers", "2"], s))),
             (C, lambda s: peer(["--model", "mlp", "--batch", "256", "--port", str(next(DDP_PORTS))],
                                s, "ddp"))],
            a.reps, a.steps)
        for num, den, target in ((A, C, 2.5), (A, B, 0.85)):
            r = med[num] / med[den]
            print(f"\nratio {num[:3]} / {den[:3]}: **{r:.2f}x** (target ≥ {target}x: "
                  f"{'met' if r >= target else 'not met'})")
            paired(rates, num, [den], f"{num[:3]} / {den[:3]}")
        same = [x["weights_digest"] == y["weights_digest"] for x, y in zip(kept[A], kept[B])]
        print(f"\nweights digest (a) == (b) in {sum(same)} of {len(same)} rounds "
              f"({kept[A][0]['weights_digest']} vs {kept[B][0]['weights_digest']})")
        s = kept[A][-1]
        print(f"(a)'s summary: ranks {s.get('ranks')}, workers_per_rank {s.get('workers_per_rank')}")
        # Traffic against a ring all-reduce's 2 (R-1)/R x gradient bytes per rank per step.
        allreduce = 2 * (MPI_RANKS - 1) / MPI_RANKS * 4 * s["parameters"]
        fields = list(bytes_fields(s))
        for name, v in fields:
            print(f"(a) {name}: {v:,.0f}")
        print(f"all-reduce's 2 (R-1)/R x gradient bytes at R = {MPI_RANKS}: {allreduce:,.0f} per rank per "
              f"step{'' if fields else ' (the summary has no bytes field to set against it)'}")

    if "bf16" in cases:
        # Targets: bf16 / f32 >= 1.6 (MLP b256) and 1.5 (cnn); bf16 / PyTorch's best of f32 and
        # bf16 >= 2 (MLP b256, issue #51) and 2.5 (MLP b32); roofline fraction >= 0.75 for the
        # MLP at batch 256 (#51) and 0.8 for cnn.
        rows = []
        for title, model, batch, steps, targets in (
                ("MLP batch 256", "mlp", 256, a.bf16_mlp_steps,
                 {"bf16/f32": 1.6, "vs torch": 2.0, "roofline": 0.75}),
                ("cnn, batch 256", "cnn", 256, a.bf16_cnn_steps, {"bf16/f32": 1.5, "roofline": 0.8}),
                ("MLP batch 32", "mlp", 32, a.bf16_mlp32_steps, {"vs torch": 2.5})):
            rows += bf16_point(title, model, batch, steps, a.reps, targets)
        print("\n### bf16 targets\n")
        print("| point | ratio | median | target | |")
        print("|---|---|---|---|---|")
        for title, what, value, target, ok in rows:
            print(f"| {title} | {what} | {value} | {target} | {'met' if ok else 'not met'} |")
        print(f"\n{sum(r[-1] for r in rows)} of {len(rows)} targets met")

    if "resnet20" in cases:
        # Target (#51): resnet20 at batch 256, 2 workers: cohort bf16 >= 2x PyTorch's best of f32
        # and bf16 (2 threads). cohort's micro-batch is the bn default (64).
        rows = bf16_point("resnet20, batch 256", "resnet20", 256, a.resnet20_steps, a.reps,
                          {"vs torch": 2.0})
        for title, what, value, target, ok in rows:
            print(f"| {title} | {what} | {value} | {target} | {'met' if ok else 'not met'} |")


if __name__ == "__main__":
    sys.exit(main())
