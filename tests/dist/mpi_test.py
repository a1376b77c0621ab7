#!/usr/bin/python3
"""Multi-rank runs of the real `cohort` binary under mpirun (tests/dist/CMakeLists.txt: ctest -R
dist_mpi, label mpi). Every launch runs in its own session under a timeout; on expiry, or when a
case ends early, the whole process group is killed.

  tests/dist/mpi_test.py --cohort build/release/cohort --data datasets/fixture [unittest args]
  e.g. ... MpiTest.test_digest_matrix   (one case)   or   -k kill   (cases matching a pattern)

The seed is random per run of the file (printed); COHORT_MPI_TEST_SEED=N repeats one.
"""
import argparse
import gzip
import json
import os
import random
import shutil
import signal
import struct
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


def launch_ranks(*per_rank):
    """One mpirun with a rank per argument list: rank r runs `cohort train per_rank[r]` (MPMD),
    as ranks on nodes that differ would."""
    cmd = list(MPIRUN)
    for r, args in enumerate(per_rank):
        cmd += ([":"] if r else []) + ["-np", "1"] + launch(1, args, mpi=False)
    return cmd


def fixture_copy(folder, train_count=None, changed_pixel=False):
    """A copy of DATA (IDX, gzipped) in folder: its first train_count training samples, and with
    changed_pixel one training pixel other than the fixture's."""
    os.makedirs(folder)
    for name in os.listdir(DATA):
        with gzip.open(os.path.join(DATA, name)) as f:
            data = bytearray(f.read())
        if name.startswith("train-") and train_count is not None:
            images = name.startswith("train-images")
            header = 16 if images else 8
            struct.pack_into(">i", data, 4, train_count)
            data = data[:header + train_count * (28 * 28 if images else 1)]
        if name.startswith("train-images") and changed_pixel:
            data[16 + 400] ^= 0x55
        with gzip.open(os.path.join(folder, name), "wb") as f:
            f.write(bytes(data))
    return folder


def kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run(cmd, timeout=RUN_TIMEOUT, env=None):
    """Runs cmd to the end (env: variables beside ENV's); returns (returncode, stdout, stderr,
    seconds). Fails on timeout."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(ENV, **(env or {})), start_new_session=True)
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


def wait_state(pid, state, timeout=10):
    """Waits until pid is in state (/proc's letter: "T" stopped)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        if stat[stat.rindex(")") + 2:].split()[0] == state:
            return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} not in state {state} within {timeout} s")


def wait_taken(pid, sig, timeout=10):
    """Waits until sig is no longer pending for pid: a cohort rank's signal thread took it (every
    other thread blocks SIGINT and SIGTERM)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/status") as f:
                pending = [int(line.split()[1], 16) for line in f
                           if line.startswith(("SigPnd:", "ShdPnd:"))]
        except FileNotFoundError:
            raise AssertionError(f"pid {pid} ended: signal {sig} took its default action")
        if not any(mask >> (sig - 1) & 1 for mask in pending):
            return
        time.sleep(0.01)
    raise AssertionError(f"signal {sig} still pending for pid {pid} after {timeout} s")


def checkpoint_step(path):
    """The step of the checkpoint at path (from `cohort eval`'s summary)."""
    summary = path + ".eval.json"
    rc, out, err, _ = run([COHORT, "eval", "--checkpoint", path, "--data", DATA, "--quiet",
                           "--summary", summary])
    assert rc == 0, f"cohort eval {path} exited {rc}\n{err}"
    with open(summary) as f:
        return json.load(f)["step"]


SLOW_FSYNC_C = r"""
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
/* fsync after COHORT_TEST_FSYNC_MS milliseconds: a slow shared filesystem. */
int fsync(int fd) {
  const char* ms = getenv("COHORT_TEST_FSYNC_MS");
  if (ms) {
    const long n = atol(ms);
    struct timespec t = {n / 1000, n % 1000 * 1000000L};
    nanosleep(&t, NULL);
  }
  return (int)syscall(SYS_fsync, fd);
}
"""


def slow_fsync_library(folder):
    """A library for LD_PRELOAD whose fsync waits COHORT_TEST_FSYNC_MS first, built in folder."""
    source, library = os.path.join(folder, "slow_fsync.c"), os.path.join(folder, "slow_fsync.so")
    with open(source, "w") as f:
        f.write(SLOW_FSYNC_C)
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    assert cc, "no C compiler (cc) for the slow-fsync library"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", library, source], check=True)
    return library


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

    def test_roofline_shares_the_leaves_over_the_jobs_replicas(self):
        """Under mpirun the floor's GEMMs are the job's leaves shared over every rank's replicas,
        measured by rank 0 alone: 2 ranks x 1 worker and 1 process x 2 workers have the same
        floor (counted per rank's replicas, 2 ranks' would read twice the 1-process one)."""
        one, _, _, _ = Runs.get("mlp", 1, 2)
        two, _, _, _ = Runs.get("mlp", 2, 1)
        a, b = one["roofline"]["gemm_seconds"], two["roofline"]["gemm_seconds"]
        print(f"roofline GEMMs: 1x2 {a * 1e6:.1f} us, 2x1 {b * 1e6:.1f} us a step")
        self.assertGreater(a, 0)
        self.assertLess(b / a, 1.5)
        self.assertGreater(b / a, 1 / 1.5)

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

    # The ranks agree before any work ---------------------------------------------------------------
    QUICK = ["--batch", "64", "--micro-batch", "8", "--steps", "2", "--workers", "1", "--quiet"]

    def refused_by_all(self, cmd, *words):
        """cmd ends with exit 2 within 30 s, having trained nothing, on one "cohort: error" line
        holding every word."""
        rc, out, err, seconds = run(cmd, timeout=60)
        self.assertEqual(rc, 2, f"stdout:\n{out}\nstderr:\n{err}")
        errors = [l for l in err.splitlines() if l.startswith("cohort: error")]
        self.assertEqual(len(errors), 1, err)
        for word in words:
            self.assertIn(word, errors[0])
        self.assertNotIn("cohort train:", out)
        self.assertLess(seconds, 30)

    def test_one_ranks_failure_ends_every_rank(self):
        """A failure on one rank only before any work (its command line, its config file, its
        inputs) is exit 2 on every rank within seconds, printed once, naming the rank."""
        garbage = os.path.join(self.tmp, "garbage.ck")
        with open(garbage, "w") as f:
            f.write("not a checkpoint\n")
        missing = os.path.join(self.tmp, "no-such")
        cases = {
            "unknown flag": (["--no-such-flag"], "--no-such-flag"),
            "missing config": (["--config", missing + ".toml"], "--config"),
            "missing data": (["--data", missing], "no-such"),
            "corrupt resume": (["--resume", garbage], "garbage.ck"),
        }
        for name, (bad, word) in cases.items():
            with self.subTest(name):
                self.refused_by_all(launch_ranks(self.QUICK, self.QUICK + bad), "rank 1: ", word)

    def test_output_paths_are_rank0s_alone(self):
        """Only rank 0 writes --summary, --metrics, --trace and --save, so only rank 0 checks
        them: paths in a folder that rank 1 lacks (given as flags or by its config file) run, and
        rank 0's own bad path is every rank's exit 2."""
        here = os.path.join(self.tmp, "here")
        os.mkdir(here)
        names = {"--summary": "s.json", "--metrics": "m.jsonl", "--trace": "t.json",
                 "--save": "c.ck"}

        def outputs(folder):
            return [a for flag, name in names.items() for a in (flag, os.path.join(folder, name))]

        elsewhere = os.path.join(self.tmp, "elsewhere")
        toml = os.path.join(self.tmp, "elsewhere.toml")
        with open(toml, "w") as f:
            f.write(f'[output]\nsummary = "{elsewhere}/s.json"\nmetrics = "{elsewhere}/m.jsonl"\n'
                    f'trace = "{elsewhere}/t.json"\n[checkpoint]\nsave = "{elsewhere}/c.ck"\n')
        for name, rank1 in {"flags": outputs(elsewhere), "config": ["--config", toml]}.items():
            with self.subTest(name):
                shutil.rmtree(here)
                os.mkdir(here)
                rc, out, err, _ = run(launch_ranks(self.QUICK + outputs(here), self.QUICK + rank1),
                                      timeout=60)
                self.assertEqual(rc, 0, err)
                self.assertEqual(sorted(os.listdir(here)), sorted(names.values()))
        self.refused_by_all(launch_ranks(self.QUICK + outputs(elsewhere), self.QUICK + outputs(here)),
                            "rank 0: ", "expected a file path", "elsewhere")

    def test_ranks_that_differ_refuse(self):
        """Ranks that would train on different things (other training data, fewer samples or as
        many with one pixel changed; another --seed or model; another checkpoint to resume; a
        --save on one rank only) are exit 2 before any work, naming the ranks and what differs."""
        fewer = fixture_copy(os.path.join(self.tmp, "fewer"), train_count=448)
        changed = fixture_copy(os.path.join(self.tmp, "changed"), changed_pixel=True)
        ck = {}
        for steps in (1, 2):
            ck[steps] = os.path.join(self.tmp, f"{steps}.ck")
            rc, _, err, _ = run(launch(1, self.QUICK + ["--steps", str(steps), "--save", ck[steps]],
                                       mpi=False))
            self.assertEqual(rc, 0, err)
        resume = ["--steps", "4", "--resume"]
        cases = {  # rank 0's flags, rank 1's, what the message says
            "fewer samples": ([], ["--data", fewer],
                              ["training split", "rank 0: 512 samples", "rank 1: 448 samples"]),
            "a pixel": ([], ["--data", changed], ["training split", "digest"]),
            "seed": ([], ["--seed", "7"], ["effective config: seed (rank 0: 1; rank 1: 7)"]),
            "model": ([], ["--model", "mlp:784-16-10"], ["effective config: model", "mlp:784-16-10"]),
            "checkpoint": (resume + [ck[1]], resume + [ck[2]],
                           ["checkpoint resumed", "rank 0: step 1", "rank 1: step 2"]),
            "save": ([], ["--save", os.path.join(self.tmp, "c.ck")], ["effective config: save (rank 0: false; rank 1: true)"]),
        }
        for name, (rank0, rank1, words) in cases.items():
            with self.subTest(name):
                self.refused_by_all(launch_ranks(self.QUICK + rank0, self.QUICK + rank1), *words)

    def test_gathers_in_pieces(self):
        """All-gathers larger than one MPI call carries (INT_MAX bytes: a model past ~0.5 G
        parameters) go in pieces; COHORT_MPI_GATHER_LIMIT makes the pieces small: 3 ranks with
        pieces of 4093 bytes train the same weights and save the same checkpoint (weights and
        Adam's state gathered from their owners) as with whole gathers."""
        flags = self.QUICK + ["--steps", "3", "--optimizer", "adam", "--lr", "0.001",
                              "--seed", str(SEED)]
        got = {}
        for limit in ("", "4093"):
            summary, ck = (os.path.join(self.tmp, f"{limit or 'whole'}.{ext}")
                           for ext in ("json", "ck"))
            rc, _, err, _ = run(launch(3, flags + ["--summary", summary, "--save", ck]),
                                env={"COHORT_MPI_GATHER_LIMIT": limit} if limit else None)
            self.assertEqual(rc, 0, err)
            with open(summary) as f, open(ck, "rb") as c:
                got[limit] = (json.load(f)["weights_digest"], c.read())
        self.assertEqual(got["4093"], got[""])
        rc, _, err, _ = run(launch(2, flags), env={"COHORT_MPI_GATHER_LIMIT": "0"})
        self.assertEqual(rc, 2, err)
        self.assertIn("COHORT_MPI_GATHER_LIMIT", err)

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

    def test_failed_save_exits_74(self):
        """A periodic save that fails during the run (here its rename: the checkpoint's name
        became a folder) ends every rank with exit 74, not 2, naming the file and the reason,
        and leaves no temporary file."""
        ck = os.path.join(self.tmp, "run.ckpt")
        cmd = launch(2, ["--epochs", "1000", "--batch", "64", "--micro-batch", "8", "--workers",
                         "1", "--quiet", "--save", ck, "--save-every", "2"])
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=ENV, start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            while not os.path.exists(ck) and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.05)
            self.assertTrue(os.path.exists(ck), "no periodic save within 60 s")
            while True:  # a save may land between the remove and the mkdir: then again
                try:
                    os.remove(ck)
                except FileNotFoundError:
                    pass
                try:
                    os.mkdir(ck)
                    break
                except FileExistsError:
                    continue
            out, err = proc.communicate(timeout=60)
        finally:
            kill_group(proc)
            proc.wait(timeout=30)
        self.assertEqual(proc.returncode, 74, err)
        self.assertIn(ck, err)
        self.assertIn("Is a directory", err)
        self.assertEqual([f for f in os.listdir(self.tmp) if ".tmp" in f], [])

    # Signals: any rank's, or mpirun's, stops every rank after a step; rank 0 saves it ---------
    def stop_case(self, send):
        """A long run saving to a file; send(proc, pids) signals it once it trains. Every rank
        stops after the same step, whose checkpoint rank 0 writes (the last step in the
        metrics). Returns (mpirun's status, its stderr)."""
        ck = os.path.join(self.tmp, "stop.ck")
        proc, metrics = self.long_run(["--save", ck])
        pids = {}
        try:
            wait_for_line(metrics, proc)
            pids = rank_pids(proc.pid, 2)
            send(proc, pids)
            rc, err, seconds = self.end_long_run(proc, pids.values(), 30, "signalled")
        finally:
            self.cleanup(proc, pids.values())  # SIGKILL: also a rank left stopped
        self.assertTrue(os.path.exists(ck), f"no checkpoint (mpirun exited {rc})\n{err[-3000:]}")
        self.assertEqual(checkpoint_step(ck), read_losses(metrics)[-1]["step"])
        return rc, err

    def test_sigterm_to_a_rank_stops_every_rank_and_saves(self):
        """SIGTERM to rank 1 alone: every rank exits 143. A second SIGTERM (a scheduler signals
        every process, and mpirun passes its own on) changes nothing: both reach rank 1 while
        rank 0 is stopped, so rank 1 is still in the run when it takes them."""
        def send(proc, pids):
            os.kill(pids[0], signal.SIGSTOP)
            wait_state(pids[0], "T")
            for _ in range(2):
                os.kill(pids[1], signal.SIGTERM)
                wait_taken(pids[1], signal.SIGTERM)
            os.kill(pids[0], signal.SIGCONT)
        rc, err = self.stop_case(send)
        self.assertEqual(rc, 143, err)

    def test_sigint_to_rank0_stops_every_rank_and_saves(self):
        rc, err = self.stop_case(lambda proc, pids: os.kill(pids[0], signal.SIGINT))
        self.assertEqual(rc, 130, err)

    def test_sigterm_to_mpirun_stops_every_rank_and_saves(self):
        """mpirun (Open MPI 4) turns a SIGINT or SIGTERM of its own into SIGTERM to every rank,
        and SIGKILL odls_base_sigkill_timeout seconds later (default 1; the ranks, saved, wait
        in MPI_Finalize for a launcher that is ending), and exits 1 whatever the ranks return."""
        rc, err = self.stop_case(lambda proc, pids: os.kill(proc.pid, signal.SIGTERM))
        self.assertNotEqual(rc, 0, err)

    def test_watchdog_pauses_while_rank0_writes(self):
        """Rank 0's writes slower than --stall-timeout (every fsync 0.6 s: 1.8 s a file, as on a
        slow shared filesystem) are no stall, nor is the other rank's wait for them: a periodic
        save, the final one and the trace, and the run ends normally."""
        library = slow_fsync_library(self.tmp)
        ck, trace = os.path.join(self.tmp, "run.ck"), os.path.join(self.tmp, "t.json")
        cmd = launch(2, ["--batch", "64", "--micro-batch", "8", "--steps", "2", "--workers", "1",
                         "--quiet", "--stall-timeout", "1", "--save", ck, "--save-every", "1",
                         "--trace", trace])
        cmd[1:1] = ["-x", "LD_PRELOAD=" + library, "-x", "COHORT_TEST_FSYNC_MS=600"]
        rc, out, err, seconds = run(cmd)
        self.assertEqual(rc, 0, err)
        self.assertGreater(seconds, 3 * 1.8, "the writes were not slowed")
        self.assertEqual(checkpoint_step(ck), 2)
        self.assertTrue(os.path.exists(trace))

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
