#!/usr/bin/python3
"""bench/run_reduce_bench.py on small sizes (tests/reduce/CMakeLists.txt: reduce_bench_command):
it exits 0, every strategy's sum was checked, the JSON holds every strategy at every size with
its fields, the plot is a PNG, and the table names each strategy.

  tests/reduce/run_reduce_bench_test.py --script bench/run_reduce_bench.py \
      --bench build/release/bench/reduce_bench [--mpi-bench build/release/bench/reduce_mpi_bench]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ARGS = None
FIELDS = {"where", "participants", "strategy", "reproducible", "bytes", "leaves",
          "seconds_median", "seconds_min", "seconds_max", "algbw_GBps", "busbw_GBps",
          "stream_GBps", "correct"}
IN_PROCESS = {"ceiling", "tree", "tree (binary)", "chunk owner", "parameter server", "serial",
              "mutex", "atomic", "ring all-reduce"}
ACROSS_RANKS = {"cohort exchange", "MPI_Allreduce", "MPI_Reduce_scatter_block + MPI_Allgather"}


class RunReduceBench(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="cohort_reduce_bench_")
        cls.sizes = [1024, 65536 + 4]  # one size not a multiple of the chunk or thread count
        cmd = [sys.executable, ARGS.script, "--bench", ARGS.bench,
               "--mpi-bench", ARGS.mpi_bench or "", "--ranks", "2" if ARGS.mpi_bench else "",
               "--threads", "1,2", "--sizes", ",".join(map(str, cls.sizes)), "--no-models",
               "--repetitions", "2", "--min-time", "0.01", "--out", cls.tmp]
        cls.proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        cls.cmd = " ".join(cmd)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_exits_0_and_prints_every_strategy(self):
        self.assertEqual(self.proc.returncode, 0,
                         f"{self.cmd}\n{self.proc.stdout}\n{self.proc.stderr}")
        for name in IN_PROCESS | (ACROSS_RANKS if ARGS.mpi_bench else set()):
            self.assertIn(name, self.proc.stdout)

    def test_json_has_every_strategy_at_every_size_with_its_fields(self):
        with open(os.path.join(self.tmp, "reduce_results.json")) as f:
            doc = json.load(f)
        for key in ("cpu", "cores", "commit", "date"):
            self.assertIn(key, doc["machine"])
        results = [r for r in doc["results"] if r["bytes"] > 0]
        # (where, participants, leaves a participant, strategy)
        want = {("threads", t, 2, s) for t in (1, 2) for s in IN_PROCESS}
        if ARGS.mpi_bench:
            want |= {("ranks", 2, per, s) for per in (1, 2) for s in ACROSS_RANKS}
        for where, n, per, strategy in want:
            for size in self.sizes:
                size = size // 4 * 4
                found = [r for r in results
                         if (r["where"], r["participants"], r["leaves"] // n, r["strategy"],
                             r["bytes"]) == (where, n, per, strategy, size)]
                self.assertEqual(len(found), 1, f"{strategy}, {where} {n}, {per}, {size} bytes")
                r = found[0]
                self.assertEqual(FIELDS - set(r), set(), r)
                self.assertTrue(r["correct"])
                self.assertLessEqual(r["seconds_min"], r["seconds_median"])
                self.assertLessEqual(r["seconds_median"], r["seconds_max"])
                self.assertGreater(r["algbw_GBps"], 0)
                if n == 1:
                    self.assertEqual(r["busbw_GBps"], 0)
        deterministic = {r["strategy"] for r in results if r["reproducible"]}
        self.assertIn("tree", deterministic)
        self.assertNotIn("ring all-reduce", deterministic)
        self.assertNotIn("atomic", deterministic)

    def test_plot_is_a_png(self):
        with open(os.path.join(self.tmp, "reduce_results.png"), "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--script", required=True)
    parser.add_argument("--bench", required=True)
    parser.add_argument("--mpi-bench", default="")
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
