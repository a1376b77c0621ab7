#!/usr/bin/python3
"""Predicted samples/s and parallel efficiency of cohort on R nodes (one MPI rank per node), for the
MLP and the CNN, from a node's measured step time, the measured bytes each rank sends per step, and
a link's bandwidth and latency. It is a model for machines we do not have, not a measurement:
nothing here runs cohort. The per-model defaults are measurements, all from one machine on
2026-12-01 (an Intel Xeon VM, family 6 model 167, 2 cores, AVX-512; Open MPI 4.1 over shared
memory with --mca btl_vader_single_copy_mechanism none; batch 256, micro-batch 128):
  --mlp-step-seconds 256/93,013 = 2.752 ms: cohort train, 1 process x 2 workers, median of 7
      rounds of `bench/peer_compare.py --cases mpi --reps 7 --steps 300`, case (b)
  --cnn-step-seconds 256/8,700 = 29.4 ms: cohort train --model cnn, 1 process x 2 workers (runs
      of 8,745, 8,425 and 8,907 samples/s; 2 ranks x 1 worker: 8,272, 8,669, 8,672)
  --mlp-bytes 1,598,766 and --cnn-bytes 1,461,958 at --measured-ranks 2: the summary's
      bytes_sent_per_step (the mean over ranks) of `mpirun -np 2 cohort train --workers 1`,
      default --weight-grads batch (a = 1.492 and 2.305; a ring all-reduce is a = 2)
The link (--bandwidth-gbps 25, --latency-us 5) is an assumption, not a measurement, and so is
--overlap 0 (conservative: the shared-memory run measured the exchange's wall time, 4-8% of the
MLP's step at 2 ranks x 1 worker, not how much of it a real link would hide). docs/scaling.md
gives the commands.

The exchange is cohort's multi-rank step (src/dist): a rank computes a contiguous run of the global
batch's leaves with its own workers, and the root's chunks, with their optimizer state, are sharded
over the R ranks (ZeRO stage 1), so that each owner sums its chunks in the leaf order one process
uses and the result is the single-process result bit for bit. Per step, phase 1: each rank sends
each chunk owner what it needs of this rank's leaves: for ranges summed from leaves (convolutions,
or everything under --weight-grads leaf) every leaf's slice of the owner's chunks; for linear
layers with batch weight gradients the rank's rows (X and dY) of the layers the owner holds part
of, which scale with the rows per rank (batch/R) and go to each owner that needs them; the first
layer's input is never sent (each owner assembles it from the data). Phase 2: each owner updates
its chunks and sends the updated weights to every other rank ((R-1)/R x G per rank on average).
Each phase sends one message to each other rank; one small all-gather per step (leaf losses,
per-chunk stats) is left out of the time.

Model, per step, for R ranks:
  G         = 4 * parameters                         gradient (and weight) bytes, f32
  bytes(R)  = (R-1)/R * G * (1 + (a-1) * g(R))        bytes each rank sends
              a: the per-model traffic coefficient (--mlp-coef); a = 2 is a ring all-reduce's
              2 (R-1)/R * G. Or from a measurement: --mlp-bytes B at --measured-ranks Rm gives
              a = B / ((Rm-1)/Rm * G).
              The 1 is phase 2's weights; a-1 is phase 1, fitted at Rm and carried to other R
              by the same (R-1)/R. That assumes one leaf per rank (micro-batch = batch / R): a
              rank with k leaves sends k slices of each summed-from-leaves range.
              g(R) = global batch / --batch: 1, except under --weak --traffic rows, where the
              phase-1 part (a-1) is taken to be rows (--weight-grads batch) and grows with the
              global batch, g = R (an upper bound for the CNN, whose convolutions' slices do not
              grow); the weights (the 1) never do
  T_bw(R)   = bytes(R) / bandwidth                   (full-duplex link: receiving overlaps sending)
  T_lat(R)  = phases * (R-1) * latency               (R-1 messages per phase, 2 phases)
  T_comm(R) = T_bw + T_lat                           (0 at R = 1)
  T_comp(R) = T1 / R   strong scaling (default): the global batch --batch stays fixed and each
                       rank computes batch/R rows; T1 is the node's measured step time at --batch,
                       root included (the sharded root's optimizer work also divides by R)
            = T1       --weak: each rank keeps --batch rows; the global batch is R * batch
  T_step(R) = T_comp + T_comm - f * min(T_comp, T_comm)      f = --overlap in [0, 1]
              (f = 0: no overlap, the default; f = 1: the shorter one is hidden entirely)
  samples/s = global batch / T_step
  efficiency E(R) = samples/s(R) / (R * samples/s(1))
Where scaling stops: T_bw is bounded by a G / bandwidth while T_lat grows as R. Strong scaling:
compute (T1/R) equals communication at a small R when T1 is close to a G / bandwidth (the MLP),
and the step is shortest near R = sqrt(T1 / (phases * latency)), past which each added rank adds
more latency than it saves compute. Weak scaling: efficiency T1 / (T1 + T_comm) falls slowly, as
the latency term grows; it reaches 50% near R = (T1 - a G / bandwidth) / (phases * latency).
Strong scaling assumes compute per sample stays constant as rows per rank shrink; it does not
below a few dozen rows per worker (cohort's MLP at batch 32 on 2 workers runs at ~0.57x of its
batch-256 samples/s, docs/benchmarks.md), so rows marked * are optimistic. A rank is a group
of leaves, so R can be at most batch / --micro-batch: rows past that are marked "no leaf".

Usage: bench/scale_model.py [--weak] [--mlp-step-seconds S] [--mlp-bytes B | --mlp-coef A]
                            [--cnn-step-seconds S] [--cnn-bytes B | --cnn-coef A]
                            [--measured-ranks 2] [--bandwidth-gbps 25] [--latency-us 5]
                            [--overlap 0] [--batch 256] [--ranks 1,2,4,...,64]
Prints one markdown table per model.
"""
import argparse
import sys

# Measured defaults (the docstring says where each comes from; 2026-12-01, this 2-core Xeon VM).
# One node's step at batch 256: 1 process x 2 workers, median samples/s -> seconds per step.
STEP_SECONDS = {"mlp": 256 / 93_013, "cnn": 256 / 8_700}
# Bytes sent per rank per step at MEASURED_RANKS (the summary's bytes_sent_per_step, mean over
# ranks; --weight-grads batch, batch 256, micro-batch 128).
MEASURED_BYTES = {"mlp": 1_598_766, "cnn": 1_461_958}
MEASURED_RANKS = 2
# Exact: mlp:784-512-256-10 and the cnn preset (832 + 51,264 + 262,400 + 2,570; README).
PARAMETERS = {"mlp": 535_818, "cnn": 317_066}
# Rows per worker below which compute per sample is known to drop (see the docstring).
FEW_ROWS_PER_WORKER = 32


def predict(t1, params, coef, r, a):
    """One table row's numbers for r ranks: a dict of seconds, bytes and rates."""
    G = 4 * params
    g = r if (a.weak and a.traffic == "rows") else 1
    sent = (r - 1) / r * G * (1 + (coef - 1) * g)
    t_bw = sent / (a.bandwidth_gbps * 1e9 / 8)
    t_lat = a.phases * (r - 1) * a.latency_us * 1e-6
    t_comm = t_bw + t_lat
    t_comp = t1 if a.weak else t1 / r
    t_step = t_comp + t_comm - a.overlap * min(t_comp, t_comm)
    global_batch = a.batch * r if a.weak else a.batch
    return {"rows": global_batch / r, "comp": t_comp, "sent": sent, "bw": t_bw, "lat": t_lat,
            "step": t_step, "rate": global_batch / t_step}


def crossover(t1, params, coef, a, r_max=1e7):
    """The R (continuous) where compute time equals communication time: past it a step spends
    more on the network than on arithmetic, and with no overlap efficiency is below 50%."""
    lo, hi = 1.0, r_max
    def gap(r):
        p = predict(t1, params, coef, r, a)
        return p["comp"] - (p["bw"] + p["lat"])
    if gap(hi) > 0:
        return f"> {r_max:.0e}"
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gap(mid) > 0 else (lo, mid)
    return f"{lo:.1f}"


def table(name, t1, params, coef, coef_source, a):
    G = 4 * params
    print(f"\n### {name}: {params:,} parameters (G = {G / 1e6:.2f} MB), node step "
          f"{1e3 * t1:.2f} ms at batch {a.batch}, a = {coef:.3f} ({coef_source})\n")
    print(f"bytes sent per rank per step = {coef:.3f} (R-1)/R x G"
          f"{' with the row part growing as R (--traffic rows)' if a.weak and a.traffic == 'rows' else ''}"
          f"; all-reduce: 2 (R-1)/R x G\n")
    print("| R | rows per rank | compute ms | MB sent per rank | bandwidth ms | latency ms "
          "| step ms | samples/s | efficiency | largest term |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    base = predict(t1, params, coef, 1, a)["rate"]
    leaves = a.batch // a.micro_batch if a.micro_batch else None
    out = []
    for r in a.ranks:
        p = predict(t1, params, coef, r, a)
        if not a.weak and (p["rows"] < 1 or (leaves and r > leaves)):
            print(f"| {r} | {p['rows']:g} | – | – | – | – | – | – | – | no leaf for every rank |")
            continue
        e = p["rate"] / (r * base)
        out.append((r, e, p))
        largest = max((p["comp"], "compute"), (p["bw"], "bandwidth"), (p["lat"], "latency"))[1]
        few = "*" if p["rows"] / a.workers_per_rank < FEW_ROWS_PER_WORKER else ""
        print(f"| {r} | {p['rows']:g}{few} | {1e3 * p['comp']:.3f} | {p['sent'] / 1e6:.2f} "
              f"| {1e3 * p['bw']:.3f} | {1e3 * p['lat']:.3f} | {1e3 * p['step']:.3f} "
              f"| {p['rate']:,.0f} | {100 * e:.0f}% | {largest} |")
    below = [r for r, e, _ in out if e < a.threshold]
    print(f"\nefficiency " + (f"below {100 * a.threshold:.0f}% from R = {below[0]}" if below else
                              f"≥ {100 * a.threshold:.0f}% through R = {out[-1][0]}")
          + f"; compute = communication at R ≈ {crossover(t1, params, coef, a)}")
    if not a.weak:
        # The bandwidth term is bounded by a G / bandwidth while the latency term grows as R, so
        # the step is shortest where the compute saved by one more rank equals the latency added.
        r_max = min(a.batch, leaves or a.batch)  # a rank needs a leaf, a leaf a row
        r_best = min(range(1, r_max + 1), key=lambda r: predict(t1, params, coef, r, a)["step"])
        root = (t1 / (a.phases * a.latency_us * 1e-6)) ** 0.5
        print(f"the step is shortest at R = {r_best} of 1..{r_max}"
              + (f" (≈ sqrt(T1 / (phases x latency)) = {root:.0f})" if a.overlap == 0 else "")
              + f"; the bandwidth term never exceeds a G / bandwidth = "
              f"{1e3 * coef * 4 * params / (a.bandwidth_gbps * 1e9 / 8):.3f} ms")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for m in ("mlp", "cnn"):
        p.add_argument(f"--{m}-step-seconds", type=float,
                       default=STEP_SECONDS[m],
                       help=f"one node's step at --batch, 1 rank (default "
                            f"{STEP_SECONDS[m]:.6f}: measured, 1 process x 2 workers, "
                            f"2026-12-01, see above)")
        p.add_argument(f"--{m}-params", type=int, default=PARAMETERS[m])
        g = p.add_mutually_exclusive_group()
        g.add_argument(f"--{m}-coef", type=float,
                       help="traffic coefficient a (overrides the measured --" + m + "-bytes; "
                            "2 = a ring all-reduce)")
        g.add_argument(f"--{m}-bytes", type=float, default=MEASURED_BYTES[m],
                       help=f"bytes sent per rank per step at --measured-ranks (default "
                            f"{MEASURED_BYTES[m]:,}: measured at R = 2, 2026-12-01, see above)")
    p.add_argument("--measured-ranks", type=int, default=MEASURED_RANKS,
                   help="R of the --*-bytes measurements (2 for the measured defaults)")
    p.add_argument("--bandwidth-gbps", type=float, default=25.0,
                   help="link bandwidth, Gbit/s (an assumption: no such link was measured)")
    p.add_argument("--latency-us", type=float, default=5.0,
                   help="per-message latency, µs (an assumption: no such link was measured)")
    p.add_argument("--phases", type=int, default=2, help="exchange phases per step, R-1 messages each")
    p.add_argument("--overlap", type=float, default=0.0,
                   help="fraction of min(compute, communication) hidden by overlap, 0..1 "
                        "(default 0: conservative, not measured)")
    p.add_argument("--batch", type=int, default=256,
                   help="global batch (strong) or batch per rank (--weak); the step's batch")
    p.add_argument("--weak", action="store_true", help="fixed batch per rank: global batch R * batch")
    p.add_argument("--traffic", choices=("gradient", "rows"), default="gradient",
                   help="--weak only: does phase 1 grow with the global batch (rows) or not")
    p.add_argument("--micro-batch", type=int, default=0,
                   help="leaf rows: R beyond batch / micro-batch has no leaf (0: no limit)")
    p.add_argument("--workers-per-rank", type=int, default=2, help="for the * mark (rows per worker)")
    p.add_argument("--threshold", type=float, default=0.5, help="efficiency named in the summary line")
    p.add_argument("--ranks", default="1,2,4,8,16,32,64")
    a = p.parse_args()
    a.ranks = [int(x) for x in a.ranks.split(",")]
    if not 0 <= a.overlap <= 1:
        p.error("--overlap: expected 0..1")
    if a.measured_ranks < 2:
        p.error("--measured-ranks: expected ≥ 2 (nothing is sent at 1)")
    if min(a.ranks) < 1 or a.batch < 1:
        p.error("--ranks and --batch: expected ≥ 1")

    mode = (f"weak scaling: {a.batch} rows per rank, global batch R x {a.batch}" if a.weak else
            f"strong scaling: global batch {a.batch} fixed, compute per rank shrinks as 1/R")
    print(f"{mode}; link {a.bandwidth_gbps:g} Gbit/s, {a.latency_us:g} µs per message, "
          f"{a.phases} phases of R-1 messages, overlap {a.overlap:g}")
    print("* = fewer than 32 rows per worker: compute per sample is no longer constant there, "
          "the prediction is optimistic")
    for m, name in (("mlp", "MLP 784-512-256-10"), ("cnn", "CNN (the cnn preset)")):
        t1 = getattr(a, f"{m}_step_seconds")
        params = getattr(a, f"{m}_params")
        coef, measured = getattr(a, f"{m}_coef"), getattr(a, f"{m}_bytes")
        if coef is not None:
            source = "given"
        else:
            rm = a.measured_ranks
            coef = measured / ((rm - 1) / rm * 4 * params)
            source = (f"from {measured:,.0f} B at R = {rm}"
                      + (", measured" if measured == MEASURED_BYTES[m] and rm == MEASURED_RANKS
                         else ""))
        table(name, t1, params, coef, source, a)


if __name__ == "__main__":
    sys.exit(main())
