"""Helpers for the multi-rank runs of the real `cohort` binary under mpirun, in
tests/dist/mpi_test.py and mpi_failure_test.py: the command lines, the launches, the training runs
the matrix shares (Runs), the /proc probes of the ranks, and main(), which runs a script's cases.
Every launch runs in its own session under a timeout; on expiry, or when a case ends early, the
whole process group is killed.
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


def children(pid):
    """{child pid: its command name} of the processes whose parent is pid."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
            found[int(entry)] = stat[stat.index("(") + 1:stat.rindex(")")]
    return found


def rank_pids(mpirun_pid, want, timeout=30):
    """The pids of the cohort ranks started by mpirun (its children named cohort), by rank."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = {}
        for child, comm in children(mpirun_pid).items():
            if comm != "cohort":
                continue
            try:
                with open(f"/proc/{child}/environ", "rb") as f:
                    env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
                pids[int(env[b"OMPI_COMM_WORLD_RANK"])] = child
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


class MpiCase(unittest.TestCase):
    """A script's cases: each case gets a folder of its own (self.tmp) in the script's (Runs.tmp,
    removed at the end)."""
    @classmethod
    def setUpClass(cls):
        Runs.tmp = tempfile.mkdtemp(prefix="cohort_mpi_test_")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(Runs.tmp, ignore_errors=True)

    def setUp(self):
        self.tmp = tempfile.mkdtemp(dir=Runs.tmp)


def main(name, doc):
    """Runs the cases of the script `name` (doc: its --help): --cohort and --data set COHORT and
    DATA, the other arguments go to unittest."""
    global COHORT, DATA
    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cohort", required=True)
    parser.add_argument("--data", required=True)
    args, rest = parser.parse_known_args()
    COHORT, DATA = os.path.abspath(args.cohort), os.path.abspath(args.data)
    print(f"{name}: seed {SEED} (COHORT_MPI_TEST_SEED={SEED} repeats it)", flush=True)
    start = time.monotonic()
    prog = unittest.main(argv=[sys.argv[0], "-v"] + rest, exit=False)
    print(f"{name}: {time.monotonic() - start:.1f} s", flush=True)
    sys.exit(0 if prog.result.wasSuccessful() else 1)

