#!/usr/bin/python3
r"""Multi-rank runs of the real `cohort` binary under mpirun on its failure paths
(tests/dist/CMakeLists.txt: dist_mpi_failure, label mpi): bad input; the ranks' agreement before
any work (a failure on one rank, output paths that rank 0 alone checks, ranks that would train on
different things); all-gathers in pieces; an exception in a rank, a killed rank, a stopped one (the
stall watchdog), a save that fails; signals to a rank or to mpirun; the watchdog pausing for rank
0's slow writes. The runs that train as they should are in mpi_test.py; the helpers both use, in
mpi_testing.py.

  tests/dist/mpi_failure_test.py --cohort build/release/cohort --data datasets/fixture \
      [unittest args]
  e.g. ... MpiFailureTest.test_stall_watchdog   (one case)   or   -k kill   (a pattern)

The seed is random per run of the file (printed); COHORT_MPI_TEST_SEED=N repeats one.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from mpi_testing import (ENV, SEED, MpiCase, checkpoint_step, fixture_copy, gone, kill_group,
                         launch, launch_ranks, main, rank_pids, read_losses, run,
                         slow_fsync_library, wait_for_line, wait_state, wait_taken)


class MpiFailureTest(MpiCase):
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

        # A folder no rank can make (a file stands where it would be): rank 0 refuses it, the
        # other ranks never check it.
        with open(os.path.join(self.tmp, "a_file"), "w") as f:
            f.write("a file, not a folder\n")
        elsewhere = os.path.join(self.tmp, "a_file", "elsewhere")
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
                            "rank 0: ", "expected a file path", "a_file is not a folder")

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


if __name__ == "__main__":
    main("mpi_failure_test", __doc__)
