#!/usr/bin/python3
r"""`cohort launch` restarting a real mpirun job of the real `cohort` binary (tests/dist/
CMakeLists.txt: dist_launch, label mpi): a rank SIGKILLed at a random step after the first
checkpoint, the job restarted on one rank fewer, and the final weights those of the uninterrupted
3-rank run and of the single process; the same with two kills; --max-restarts 0 ending with the
failure's status; a bad flag, bad input and a missing --save not retried; SIGTERM to the
supervisor stopping the job once, saved, without a restart. The helpers are in
mpi_testing.py.

  tests/dist/launch_test.py --cohort build/release/cohort --data datasets/fixture [unittest args]
  e.g. ... LaunchTest.test_kill_and_shrink   (one case)

The seed is random per run of the file (printed); COHORT_MPI_TEST_SEED=N repeats one. It draws
the steps at which ranks are killed and which ranks.
"""
import json
import os
import random
import signal
import subprocess
import sys
import time

from mpi_testing import (ENV, MPIRUN, SEED, MpiCase, children, kill_group, main, rank_pids,
                         read_losses, run)
import mpi_testing

STEPS = 240
SAVE_EVERY = 10
# batch 64 in 8 leaves: every split below computes the same leaves.
TRAIN = ["--batch", "64", "--micro-batch", "8", "--workers", "1", "--steps", str(STEPS),
         "--warmup-steps", "0", "--log-every", "1", "--quiet"]


def last_step(metrics):
    """The last step line's step in the metrics file (0 if none yet)."""
    try:
        with open(metrics) as f:
            steps = [json.loads(l)["step"] for l in f if '"kind":"step"' in l and l.endswith("\n")]
    except (OSError, ValueError):
        return 0
    return steps[-1] if steps else 0


class LaunchTest(MpiCase):
    def train_args(self, tag):
        """TRAIN with this case's seed, checkpoint, metrics and summary files."""
        files = {k: os.path.join(self.tmp, f"{tag}.{k}") for k in ("ckpt", "jsonl", "json")}
        return files, TRAIN + ["--data", mpi_testing.DATA, "--seed", str(SEED),
                               "--save", files["ckpt"], "--save-every", str(SAVE_EVERY),
                               "--metrics", files["jsonl"], "--summary", files["json"]]

    def digest(self, summary):
        with open(summary) as f:
            return json.load(f)["weights_digest"]

    def reference(self):
        """The weights digest of the uninterrupted 3-rank run and of the single process (which
        must agree)."""
        if not hasattr(LaunchTest, "_reference"):
            digests = []
            for ranks in (3, 1):
                files, args = self.train_args(f"ref{ranks}")
                cmd = [mpi_testing.COHORT, "train"] + args
                rc, out, err, _ = run((MPIRUN + ["-np", "3"] + cmd) if ranks == 3 else cmd)
                self.assertEqual(rc, 0, err)
                digests.append(self.digest(files["json"]))
            self.assertEqual(digests[0], digests[1], "3 ranks and 1 process differ")
            LaunchTest._reference = digests[0]
        return LaunchTest._reference

    def supervised(self, launch_flags, kills, tag):
        """`cohort launch launch_flags -- mpirun -np 3 cohort train ...`, SIGKILLing one rank of
        each successive mpirun at each step of `kills` (a step of that job's own, past its first
        checkpoint). Returns (rc, stderr, files, killed: [(step seen, rank)])."""
        files, args = self.train_args(tag)
        cmd = ([mpi_testing.COHORT, "launch"] + launch_flags + ["--"] + MPIRUN + ["-np", "3"] +
               [mpi_testing.COHORT, "train"] + args)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=ENV, start_new_session=True)
        rng = random.Random(SEED)
        killed, seen_mpiruns, ranks = [], set(), 3
        try:
            for step in kills:
                deadline = time.monotonic() + 60
                while True:  # the next mpirun the supervisor starts
                    self.assertLess(time.monotonic(), deadline, "no new mpirun within 60 s")
                    self.assertIsNone(proc.poll(), "the launch ended before the kill")
                    fresh = [p for p in children(proc.pid) if p not in seen_mpiruns]
                    if fresh:
                        break
                    time.sleep(0.05)
                mpirun = fresh[0]
                seen_mpiruns.add(mpirun)
                pids = rank_pids(mpirun, ranks)
                while last_step(files["jsonl"]) < step:
                    self.assertLess(time.monotonic(), deadline, f"step {step} not reached")
                    self.assertIsNone(proc.poll(), "the launch ended before the kill")
                    time.sleep(0.02)
                victim = rng.randrange(ranks)
                os.kill(pids[victim], signal.SIGKILL)
                killed.append((last_step(files["jsonl"]), victim))
                ranks -= 1 if "--shrink" in launch_flags else 0
            _, err = proc.communicate(timeout=120)
        finally:
            kill_group(proc)
        print(f"\n  {tag}: killed (step seen, rank) {killed}; launch exited {proc.returncode}",
              file=sys.stderr)
        return proc.returncode, err, files, killed

    def check_whole(self, files):
        """The metrics hold every step 1..STEPS once, in order; the summary, all of them."""
        steps = [m["step"] for m in read_losses(files["jsonl"])]
        self.assertEqual(steps, list(range(1, STEPS + 1)))
        with open(files["json"]) as f:
            self.assertEqual(json.load(f)["steps"], STEPS)

    def restart_lines(self, err):
        return [l for l in err.splitlines() if l.startswith("cohort launch: restart")]

    def test_kill_and_shrink(self):
        """3 ranks, one SIGKILLed at a random step after the first checkpoint: the supervisor
        restarts on 2 from the newest checkpoint and ends with the uninterrupted run's weights."""
        step = random.Random(SEED).randrange(SAVE_EVERY + 1, STEPS // 2)
        rc, err, files, killed = self.supervised(["--shrink"], [step], "one_kill")
        self.assertEqual(rc, 0, err)
        lines = self.restart_lines(err)
        self.assertEqual(len(lines), 1, err)
        print("  " + lines[0], file=sys.stderr)
        self.assertIn(f"rank {killed[0][1]} ", lines[0])
        self.assertIn("signal 9", lines[0])
        self.assertIn("on 2 ranks", lines[0])
        resumed = int(lines[0].split("from step ")[1].split()[0])
        self.assertGreaterEqual(resumed, SAVE_EVERY)
        self.assertEqual(resumed % SAVE_EVERY, 0)
        self.assertLessEqual(resumed, killed[0][0])
        self.assertEqual(self.digest(files["json"]), self.reference())
        self.check_whole(files)

    def test_two_kills(self):
        """Two successive kills: 3 ranks, then 2, then 1; the same weights."""
        rng = random.Random(SEED + 1)
        first = rng.randrange(SAVE_EVERY + 1, STEPS // 3)
        second = rng.randrange(first + 2 * SAVE_EVERY, 2 * STEPS // 3)
        rc, err, files, killed = self.supervised(["--shrink"], [first, second], "two_kills")
        self.assertEqual(rc, 0, err)
        lines = self.restart_lines(err)
        self.assertEqual(len(lines), 2, err)
        self.assertIn("on 2 ranks", lines[0])
        self.assertIn("on 1 rank", lines[1])
        self.assertEqual(self.digest(files["json"]), self.reference())
        self.check_whole(files)

    def test_no_restarts_left(self):
        """--max-restarts 0: the launch ends with the status of the failure, which it names."""
        rc, err, files, _ = self.supervised(["--max-restarts", "0"], [SAVE_EVERY + 5], "no_more")
        self.assertNotIn(rc, (0, 2), err)
        self.assertEqual(self.restart_lines(err), [], err)
        last = [l for l in err.splitlines() if l.startswith("cohort launch:")]
        self.assertEqual(len(last), 1, err)
        self.assertIn("no restarts left", last[0])
        self.assertIn(f"exit status {rc})", last[0])

    def test_sigterm_stops_the_job_once(self):
        """SIGTERM to the supervisor reaches the job once: every rank stops after its step and
        saves, and the launch exits 143 without a restart."""
        files, args = self.train_args("sigterm")
        args[args.index("--steps") + 1] = "100000"
        cmd = ([mpi_testing.COHORT, "launch", "--"] + MPIRUN + ["-np", "2"] +
               [mpi_testing.COHORT, "train"] + args)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=ENV, start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            while last_step(files["jsonl"]) < SAVE_EVERY + 1:
                self.assertLess(time.monotonic(), deadline, "no step past the first save")
                self.assertIsNone(proc.poll(), "the launch ended early")
                time.sleep(0.05)
            os.kill(proc.pid, signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
        finally:
            kill_group(proc)
        self.assertEqual(proc.returncode, 143, err)
        self.assertEqual(self.restart_lines(err), [], err)
        with open(files["jsonl"]) as f:
            steps = [json.loads(l)["step"] for l in f if '"kind":"step"' in l]
        rc, out, err, _ = run([mpi_testing.COHORT, "eval", "--checkpoint", files["ckpt"],
                               "--data", mpi_testing.DATA, "--quiet", "--summary",
                               files["json"]])
        self.assertEqual(rc, 0, err)
        with open(files["json"]) as f:
            self.assertEqual(json.load(f)["step"], steps[-1])  # saved where it stopped

    def test_not_retried(self):
        """Bad input (exit 2 before the first step) is not retried; a flag cohort train does not
        know, or no --save, is refused by the launch itself before anything runs."""
        files, args = self.train_args("bad")
        job = MPIRUN + ["-np", "2", mpi_testing.COHORT, "train"] + args
        without_save = [w for i, w in enumerate(job)
                        if w != "--save" and (i == 0 or job[i - 1] != "--save")]
        cases = {
            "batch 0": (job + ["--batch", "0"], "--batch"),
            "unknown flag": (job + ["--no-such-flag"], "--no-such-flag"),
            "no --save": (without_save, "--save"),
        }
        for name, (command, word) in cases.items():
            with self.subTest(name):
                rc, out, err, _ = run([mpi_testing.COHORT, "launch", "--"] + command, timeout=60)
                self.assertEqual(rc, 2, f"stdout:\n{out}\nstderr:\n{err}")
                self.assertEqual(self.restart_lines(err), [], err)
                self.assertIn(word, err)
                self.assertFalse(os.path.exists(files["ckpt"]), "the job trained")


if __name__ == "__main__":
    main("launch_test", __doc__)
