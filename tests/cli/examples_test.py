#!/usr/bin/python3
"""Every job config in examples/ runs from a fresh copy of the repository (tests/cli/CMakeLists.txt:
cli_examples): examples/ and datasets/ copied into an empty folder, no runs/ in it, then
`cohort train --config examples/NAME.toml --steps 2` from there, as a newcomer runs it after the
README's setup. Each run exits 0 and writes the outputs its config names, in the folders the run
creates. A flag replaces its config key before anything checks it: a config whose checkpoint
folder cannot be made and whose micro-batch is out of range is refused alone and runs when --save
and --micro-batch replace those keys.

  tests/cli/examples_test.py --cohort build/release/cohort --source . [unittest args]
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import unittest

COHORT = None
SOURCE = None
TIMEOUT = 300  # seconds for one example's two steps and its evaluation


class ExamplesTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="cohort_examples_test_")
        for folder in ("examples", "datasets"):
            shutil.copytree(os.path.join(SOURCE, folder), os.path.join(self.tmp, folder),
                            ignore=shutil.ignore_patterns("embed"))
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "runs")))

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def train(self, *args):
        cmd = [COHORT, "train"] + list(args)
        proc = subprocess.run(cmd, cwd=self.tmp, capture_output=True, text=True, timeout=TIMEOUT)
        return proc.returncode, proc.stdout, proc.stderr, " ".join(cmd)

    def test_every_example_runs_from_a_fresh_copy(self):
        examples = sorted(glob.glob(os.path.join(SOURCE, "examples", "*.toml")))
        self.assertGreaterEqual(len(examples), 5)
        for path in examples:
            name = os.path.basename(path)
            with open(path, "rb") as f:
                config = tomllib.load(f)
            outputs = [config.get("output", {}).get(k) for k in ("summary", "metrics")]
            outputs.append(config.get("checkpoint", {}).get("save"))
            outputs = [o for o in outputs if o]
            with self.subTest(example=name):
                rc, out, err, cmd = self.train("--config", f"examples/{name}", "--steps", "2",
                                               "--quiet")
                self.assertEqual(rc, 0, f"{cmd}\n{out}\n{err}")
                for o in outputs:
                    self.assertTrue(os.path.isfile(os.path.join(self.tmp, o)), f"{name}: {o}")

    def test_a_flag_replaces_its_config_key_before_any_check(self):
        # The config's checkpoint is in a folder that cannot be made (a file stands where the
        # folder would be): replaced by --save, it is never checked; left alone, it is refused.
        os.makedirs(os.path.join(self.tmp, "runs"))
        with open(os.path.join(self.tmp, "blocked"), "w") as f:
            f.write("a file, not a folder\n")
        config = os.path.join(self.tmp, "job.toml")
        with open(config, "w") as f:
            f.write('[data]\ndir = "datasets/fixture"\n[model]\nspec = "mlp:784-16-10"\n'
                    '[run]\nbatch = 64\nmicro_batch = 100000\n'
                    '[checkpoint]\nsave = "blocked/mlp.ckpt"\n')
        rc, out, err, cmd = self.train("--config", config, "--steps", "1", "--quiet")
        self.assertEqual(rc, 2, f"{cmd}\n{out}\n{err}")
        self.assertIn("blocked", err)
        rc, out, err, cmd = self.train("--config", config, "--steps", "1", "--quiet",
                                       "--save", "runs/new/mlp.ckpt", "--micro-batch", "16")
        self.assertEqual(rc, 0, f"{cmd}\n{out}\n{err}")
        self.assertTrue(os.path.isfile(os.path.join(self.tmp, "runs", "new", "mlp.ckpt")))


def main():
    global COHORT, SOURCE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cohort", required=True)
    parser.add_argument("--source", required=True)
    args, rest = parser.parse_known_args()
    COHORT = os.path.abspath(args.cohort)
    SOURCE = os.path.abspath(args.source)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
