#!/usr/bin/python3
"""Multi-rank runs of the real `cohort` binary under mpirun (tests/dist/CMakeLists.txt: ctest -R
dist_mpi, label mpi). Every launch runs in its own session under a timeout; on expiry, or when a
case ends early, the whole process group is killed.

  tests/dist/mpi_test.py --cohort build/release/cohort --data datasets/fixture [unittest args]
  e.g. ... MpiTest.test_digest_matrix   (one case)   or   -k kill   (cases matching a pattern)

The seed is random per run of the file (printed); COHORT_MPI_TEST_SEED=N repeats one.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

COHORT = None
DATA = None
SEED = int(os.environ.get("COHORT_MPI_TEST_SEED", random.randrange(1, 1_000_000)))

MPIRUN = ["mpirun", "--oversubscribe", "--mca", "btl_vader_single_copy_mechanism", "none"]
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
RUN_TIMEOUT = 120  # seconds for any one launch that should finish by itself

# The matrix's common flags: batch 64, in micro-batches of 8 unless the config says otherwise
# (8 leaves: 4 ranks get 2 each).
BASE = ["--batch", "64", "--steps", "6", "--warmup-steps", "0", "--quiet",
        "--log-every", "1"]
CONFIGS = {
    "mlp": [],
    "cnn": ["--model", "cnn"],
    "adam": ["--optimizer", "adam", "--lr", "0.001"],
    "clip": ["--clip-norm", "0.05"],
    "leaf": ["--weight-grads", "leaf"],
    # bf16 replicas: every rank converts the weights it receives, as the owners' sweeps do.
    "bf16": ["--precision", "bf16", "--allow-emulated-bf16"],
    "bf16_cnn": ["--model", "cnn", "--precision", "bf16", "--allow-emulated-bf16"],
    # bn (statistics per leaf, all-gathered and folded in leaf order) with seeded augmentation.
    "bn": ["--model", "conv(8,3,1,1,nobias)-bn-relu-res(8)-res(16,2)-gap-linear(10)",
           "--augment", "crop:4,flip"],
    # 2 leaves: 3 and 4 ranks leave ranks without leaves (they still own chunks of the root).
    "few_leaves": ["--micro-batch", "32"],
}
SPLITS = [(1, 1), (1, 2), (2, 1), (2, 2), (3, 1), (4, 1)]  # (ranks, workers per rank)


def launch(ranks, args, mpi=True):
    """The command for `cohort train args` on `ranks` ranks (mpi=False: a plain process)."""
    cmd = [COHORT, "train", "--data", DATA] + list(args)
    return (MPIRUN + ["-np", str(ranks)] + cmd) if mpi else cmd


def kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run(cmd, timeout=RUN_TIMEOUT):
    """Runs cmd to the end; returns (returncode, stdout, stderr, seconds). Fails on timeout."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ENV, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        raise AssertionError(f"timed out after {timeout} s: {' '.join(cmd)}\n"
                             f"stdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}")
    finally:
        kill_group(proc)  # anything the launch left behind in its group
    return proc.returncode, out, err, time.monotonic() - start


def bf16_support():
    """What `cohort --version` says oneDNN does with bf16 here: none, emulated or native."""
    rc, out, err, _ = run([COHORT, "--version"])
    assert rc == 0, err
    for line in out.splitlines():
        if line.startswith("CPU ") and ", bf16 " in line:
            return line.rsplit(", bf16 ", 1)[1].strip()
    raise AssertionError(f"no bf16 line in cohort --version:\n{out}")


def read_losses(path):
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    return [m for m in lines if m.get("kind") == "step"]


class Runs:
    """Training runs by (config, ranks, workers), each made once per file (the matrix and the
    summary check share them)."""
    cache = {}
    tmp = None

    @classmethod
    def get(cls, config, ranks, workers, extra=()):
        key = (config, ranks, workers, tuple(extra))
        if key not in cls.cache:
            tag = f"{config}_{ranks}x{workers}_{len(cls.cache)}"
            summary = os.path.join(cls.tmp, tag + ".json")
            metrics = os.path.join(cls.tmp, tag + ".jsonl")
            flags = CONFIGS[config]
            if "--micro-batch" not in flags:
                flags = ["--micro-batch", "8"] + flags
            args = (BASE + flags + list(extra) +
                    ["--seed", str(SEED), "--workers", str(workers),
                     "--summary", summary, "--metrics", metrics])
            # 1x1 is a plain process, no mpirun: the oracle.
            cmd = launch(ranks, args, mpi=(ranks, workers) != (1, 1))
            rc, out, err, _ = run(cmd)
            assert rc == 0, f"{' '.join(cmd)} exited {rc}\nstdout:\n{out}\nstderr:\n{err}"
            with open(summary) as f:
                cls.cache[key] = (json.load(f), read_losses(metrics), out, err)
        return cls.cache[key]


def rank_pids(mpirun_pid, want, timeout=30):
    """The pids of the cohort ranks started by mpirun (its children named cohort), by rank."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
                comm = stat[stat.index("(") + 1:stat.rindex(")")]
                ppid = int(stat[stat.rindex(")") + 2:].split()[1])
                if ppid != mpirun_pid or comm != "cohort":
                    continue
                with open(f"/proc/{entry}/environ", "rb") as f:
                    env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
                pids[int(env[b"OMPI_COMM_WORLD_RANK"])] = int(entry)
            except (OSError, ValueError, KeyError):
                continue
        if len(pids) == want:
            return pids
        time.sleep(0.1)
    raise AssertionError(f"did not find {want} cohort ranks under mpirun {mpirun_pid}")


def gone(pid, timeout=5):
    """Whether pid ends (exits, or is a zombie) within timeout seconds: a SIGKILLed process needs
    a moment to exit after the signal is sent."""
    deadline = time.monotonic() + timeout
    while running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def running(pid):
    """Whether pid is alive and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] != "Z"


def wait_for_line(path, proc, timeout=60):
    """Waits until rank 0 has written a step to the metrics file (training has started)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended ({proc.returncode}) before training started")
        if os.path.exists(path):
            with open(path) as f:
                if any('"kind":"step"' in line for line in f):
                    return
        time.sleep(0.1)
    raise AssertionError(f"no step in {path} within {timeout} s")


class MpiTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        Runs.tmp = tempfile.mkdtemp(prefix="cohort_mpi_test_")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(Runs.tmp, ignore_errors=True)

    def setUp(self):
        self.tmp = tempfile.mkdtemp(dir=Runs.tmp)

    # a, b ---------------------------------------------------------------------------------------
    def test_digest_matrix(self):
        """Every (ranks x workers) split gives the single process's weights, losses and test
        figures, bit for bit, for the MLP, the cnn, Adam, gradient clipping, bf16 and bn."""
        no_bf16 = bf16_support() == "none"
        for config in CONFIGS:
            if no_bf16 and "bf16" in CONFIGS[config]:
                # oneDNN has no bf16 kernels here (no AVX-512): the run is refused before any
                # work, on every rank; its matrix needs a CPU that has them.
                with self.subTest(config=config, seed=SEED):
                    for cmd in (launch(1, BASE + CONFIGS[config], mpi=False),
                                launch(2, BASE + CONFIGS[config] + ["--workers", "1"])):
                        rc, out, err, _ = run(cmd)
                        self.assertEqual(rc, 2, f"{' '.join(cmd)}\n{out}\n{err}")
                        self.assertIn("--precision bf16", err)
                    self.skipTest(f"{config}: oneDNN has no bf16 kernels on this CPU")
                continue
            oracle, oracle_losses, _, _ = Runs.get(config, 1, 1)
            self.assertTrue(oracle_losses, f"{config}: no steps in the metrics")
            self.assertEqual(len(oracle_losses), oracle["steps"])
            if config == "clip":
                norms = [m["grad_norm"] for m in oracle_losses]
                self.assertGreater(max(norms), 0.05, "--clip-norm 0.05 never clips: pick smaller")
            for ranks, workers in SPLITS[1:]:
                with self.subTest(config=config, ranks=ranks, workers=workers, seed=SEED):
                    summary, losses, _, _ = Runs.get(config, ranks, workers)
                    self.assertEqual(summary["steps"], oracle["steps"])
                    self.assertEqual(summary["weights_digest"], oracle["weights_digest"])
                    self.assertEqual([m["loss"] for m in losses],
                                     [m["loss"] for m in oracle_losses])
                    if config == "clip":
                        self.assertEqual([m["grad_norm"] for m in losses],
                                         [m["grad_norm"] for m in oracle_losses])
                    self.assertEqual(summary["test_loss"], oracle["test_loss"])
                    self.assertEqual(summary["test_accuracy"], oracle["test_accuracy"])
                    self.assertEqual(summary["train_loss"], oracle["train_loss"])

    def test_summary_fields(self):
        """ranks, workers_per_rank and bytes_sent_per_step describe the split."""
        for ranks, workers in SPLITS:
            with self.subTest(ranks=ranks, workers=workers):
                summary, _, _, _ = Runs.get("mlp", ranks, workers)
                self.assertEqual(summary["ranks"], ranks)
                self.assertEqual(summary["workers_per_rank"], workers)
                self.assertEqual(summary["micro_batch"], 8)
                if ranks > 1:
                    self.assertGreater(summary["bytes_sent_per_step"], 0)
                else:
                    self.assertEqual(summary["bytes_sent_per_step"], 0)

    def test_quiet_prints_nothing(self):
        """--quiet: no rank prints anything, whatever the split (mpirun binds each of 2 ranks to
        one core, so 2x2 asks for more workers than the rank's cores)."""
        for ranks, workers in SPLITS:
            with self.subTest(ranks=ranks, workers=workers):
                _, _, out, err = Runs.get("mlp", ranks, workers)
                self.assertEqual(out, "")
                self.assertEqual(err, "")

    def test_only_rank0_prints(self):
        """Without --quiet, the header and progress come once (from rank 0), nothing on stderr."""
        rc, out, err, _ = run(launch(3, ["--batch", "64", "--micro-batch", "8", "--steps", "3",
                                         "--workers", "1"]))
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.count("cohort train:"), 1, out)
        self.assertIn("3 ranks", out)
        self.assertEqual(err.strip(), "")

    # c ------------------------------------------------------------------------------------------
    def resume_case(self, optimizer, first, second, k=3, n=7):
        flags = (["--batch", "64", "--micro-batch", "8", "--warmup-steps", "0", "--schedule",
                  "constant", "--quiet", "--seed", str(SEED)] + optimizer)
        oracle = os.path.join(self.tmp, "oracle.json")
        rc, out, err, _ = run(launch(1, flags + ["--workers", "1", "--steps", str(n),
                                                 "--summary", oracle], mpi=False))
        self.assertEqual(rc, 0, err)
        ck = os.path.join(self.tmp, "ck.bin")
        (r1, w1), (r2, w2) = first, second
        rc, out, err, _ = run(launch(r1, flags + ["--workers", str(w1), "--steps", str(k),
                                                  "--save", ck], mpi=(r1, w1) != (1, 1)))
        self.assertEqual(rc, 0, err)
        self.assertTrue(os.path.exists(ck))
        resumed = os.path.join(self.tmp, "resumed.json")
        rc, out, err, _ = run(launch(r2, flags + ["--workers", str(w2), "--steps", str(n),
                                                  "--resume", ck, "--summary", resumed],
                                     mpi=(r2, w2) != (1, 1)))
        self.assertEqual(rc, 0, err)
        with open(oracle) as f:
            want = json.load(f)
        with open(resumed) as f:
            got = json.load(f)
        self.assertEqual(got["steps"], n)
        self.assertEqual(got["weights_digest"], want["weights_digest"])
        self.assertEqual(got["test_loss"], want["test_loss"])

    def test_resume_2x1_to_1x2_momentum(self):
        self.resume_case([], (2, 1), (1, 2))

    def test_resume_1x2_to_3x1_momentum(self):
        self.resume_case([], (1, 2), (3, 1))

    def test_resume_2x1_to_3x1_adam(self):
        self.resume_case(["--optimizer", "adam", "--lr", "0.001"], (2, 1), (3, 1))

    # d ------------------------------------------------------------------------------------------
    def test_bad_input_refused_once(self):
        """Bad input: exit 2 on every rank, one "cohort: error" line, no training output."""
        garbage = os.path.join(self.tmp, "garbage.ck")
        with open(garbage, "w") as f:
            f.write("not a checkpoint\n")
        cases = {
            "batch 0": (2, ["--batch", "0"]),
            "missing data": (3, ["--steps", "2", "--data", os.path.join(self.tmp, "no-such")]),
            "missing resume": (2, ["--steps", "2", "--resume", os.path.join(self.tmp, "no.ck")]),
            "corrupt resume": (2, ["--steps", "2", "--resume", garbage]),
            "model mismatch": (3, ["--steps", "2", "--model", "mlp:10-10"]),
        }
        for name, (ranks, args) in cases.items():
            with self.subTest(name, ranks=ranks):
                rc, out, err, _ = run(launch(ranks, args))
                self.assertEqual(rc, 2, f"stdout:\n{out}\nstderr:\n{err}")
                errors = [l for l in err.splitlines() if l.startswith("cohort: error")]
                self.assertEqual(len(errors), 1, err)
                self.assertNotIn("cohort train:", out)
                self.assertNotIn("loss", out + err)
                self.assertNotIn("step", out)

    # e ------------------------------------------------------------------------------------------
    def test_exception_in_rank_ends_job(self):
        rc, out, err, seconds = run(launch(2, ["--batch", "64", "--micro-batch", "8", "--steps",
                                               "50", "--lr", "1e15", "--warmup-steps", "0",
                                               "--workers", "1", "--quiet"]), timeout=60)
        self.assertNotEqual(rc, 0, err)
        self.assertIn("rank", err)
        self.assertIn("step", err)
        self.assertIn("non-finite", err)

    # f, g ---------------------------------------------------------------------------------------
    def long_run(self, extra=()):
        metrics = os.path.join(self.tmp, "long.jsonl")
        cmd = launch(2, ["--epochs", "1000", "--batch", "64", "--micro-batch", "8", "--workers",
                         "1", "--quiet", "--log-every", "1", "--metrics", metrics] + list(extra))
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=ENV, start_new_session=True)
        return proc, metrics

    def end_long_run(self, proc, pids, deadline_s, what):
        """Waits up to deadline_s for mpirun to exit; returns (rc, stderr, seconds)."""
        start = time.monotonic()
        try:
            out, err = proc.communicate(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            self.cleanup(proc, pids)
            out, err = proc.communicate()
            self.fail(f"{what}: mpirun still running {deadline_s} s later\nstderr:\n{err[-3000:]}")
        return proc.returncode, err, time.monotonic() - start

    def cleanup(self, proc, pids):
        kill_group(proc)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=30)

    def kill_case(self, victim):
        proc, metrics = self.long_run()
        pids = {}
        try:
            wait_for_line(metrics, proc)
            pids = rank_pids(proc.pid, 2)
            os.kill(pids[victim], signal.SIGKILL)
            rc, err, seconds = self.end_long_run(proc, pids.values(), 10,
                                                 f"rank {victim} killed")
            self.assertNotEqual(rc, 0, err)
            print(f"\n  rank {victim} killed: mpirun exited {rc} after {seconds:.1f} s",
                  file=sys.stderr)
        finally:
            self.cleanup(proc, pids.values())
        for pid in pids.values():
            self.assertTrue(gone(pid), f"rank pid {pid} still running 5 s after SIGKILL")

    def test_kill_rank1_ends_job(self):
        self.kill_case(1)

    def test_kill_rank0_ends_job(self):
        self.kill_case(0)

    def test_stall_watchdog(self):
        proc, metrics = self.long_run(["--stall-timeout", "3"])
        pids = {}
        try:
            wait_for_line(metrics, proc)
            pids = rank_pids(proc.pid, 2)
            os.kill(pids[1], signal.SIGSTOP)
            rc, err, seconds = self.end_long_run(proc, pids.values(), 3 + 5, "rank 1 stopped")
            self.assertNotEqual(rc, 0, err)
            self.assertIn("--stall-timeout", err)
            print(f"\n  rank 1 stopped: mpirun exited {rc} after {seconds:.1f} s",
                  file=sys.stderr)
        finally:
            for pid in pids.values():
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            self.cleanup(proc, pids.values())
        for pid in pids.values():
            self.assertTrue(gone(pid), f"rank pid {pid} still running 5 s after SIGKILL")

    # h, i ---------------------------------------------------------------------------------------
    def test_trace(self):
        trace = os.path.join(self.tmp, "t.json")
        rc, out, err, _ = run(launch(2, ["--batch", "64", "--micro-batch", "8", "--steps", "3",
                                         "--workers", "1", "--quiet", "--trace", trace]))
        self.assertEqual(rc, 0, err)
        with open(trace) as f:
            doc = json.load(f)
        events = doc["traceEvents"] if isinstance(doc, dict) else doc
        names = {e.get("name") for e in events if e.get("ph") != "M"}
        for span in ("send", "wait", "forward", "backward"):
            self.assertIn(span, names)

    def test_help_mentions_mpi(self):
        rc, out, err, _ = run([COHORT, "train", "--help"], timeout=30)
        self.assertEqual(rc, 0, err)
        self.assertIn("MPI", out)
        self.assertIn("mpirun", out)
        self.assertIn("--stall-timeout", out)


def main():
    global COHORT, DATA
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cohort", required=True)
    parser.add_argument("--data", required=True)
    args, rest = parser.parse_known_args()
    COHORT, DATA = os.path.abspath(args.cohort), os.path.abspath(args.data)
    print(f"mpi_test: seed {SEED} (COHORT_MPI_TEST_SEED={SEED} repeats it)", flush=True)
    start = time.monotonic()
    prog = unittest.main(argv=[sys.argv[0], "-v"] + rest, exit=False)
    print(f"mpi_test: {time.monotonic() - start:.1f} s", flush=True)
    sys.exit(0 if prog.result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
