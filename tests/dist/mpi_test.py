#!/usr/bin/python3
"""Multi-rank runs of the real `cohort` binary under mpirun that train as they should
(tests/dist/CMakeLists.txt: dist_mpi, label mpi): every (ranks x workers) split gives the single
process's weights, losses and test figures bit for bit; the summary's fields and roofline; what
is printed; resuming across splits; the trace; --help. The failure paths are in
mpi_failure_test.py; the helpers both use, in mpi_testing.py.

  tests/dist/mpi_test.py --cohort build/release/cohort --data datasets/fixture [unittest args]
  e.g. ... MpiTest.test_digest_matrix   (one case)   or   -k resume   (cases matching a pattern)

The seed is random per run of the file (printed); COHORT_MPI_TEST_SEED=N repeats one.
"""
import json
import os

import mpi_testing
from mpi_testing import BASE, CONFIGS, SEED, SPLITS, MpiCase, Runs, bf16_support, launch, main, run


class MpiTest(MpiCase):
    def text_folder(self):
        """A text folder in self.tmp: Tiny Shakespeare's first 20,000 characters."""
        folder = os.path.join(self.tmp, "text")
        os.makedirs(folder)
        with open(os.path.join(mpi_testing.DATA, "..", "tinyshakespeare", "input.txt"),
                  encoding="utf-8") as f:
            head = f.read(20000)
        with open(os.path.join(folder, "input.txt"), "w", encoding="utf-8") as f:
            f.write(head)
        return folder

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

    def test_language_model_same_weights_on_every_split(self):
        """A language model (gpt:, with dropout, AdamW, clipping) on text: 2 and 3 ranks give the
        single process's weights and validation loss, in f32 and bf16; a checkpoint of 2 ranks
        resumes on 3 to the uninterrupted run's weights. Heads of 32 in windows of 32: bf16
        attention is cohort's kernel where the CPU has AVX-512 with BF16."""
        folder = self.text_folder()
        flags = ["--data", folder, "--model", "gpt:2-2-64-32-0.1", "--batch", "12",
                 "--micro-batch", "2", "--steps", "6", "--optimizer", "adamw", "--lr", "0.003",
                 "--clip-norm", "1", "--warmup-steps", "0", "--workers", "1", "--quiet",
                 "--seed", str(SEED)]
        precisions = ["f32"] + (["bf16"] if bf16_support() != "none" else [])
        for precision in precisions:
            extra = ["--precision", precision, "--allow-emulated-bf16"]
            got = {}
            for ranks in (1, 2, 3):
                summary = os.path.join(self.tmp, f"{precision}_{ranks}.json")
                rc, out, err, _ = run(launch(ranks, flags + extra + ["--summary", summary],
                                             mpi=ranks > 1))
                self.assertEqual(rc, 0, f"{ranks} ranks, {precision}:\n{err}")
                with open(summary) as f:
                    s = json.load(f)
                got[ranks] = (s["weights_digest"], s["val_loss"])
            with self.subTest(precision=precision, seed=SEED):
                self.assertEqual(got[2], got[1])
                self.assertEqual(got[3], got[1])
            if precision == "f32":
                got_f32 = got
        # The step-3 checkpoint of a 2-rank run (kept as gpt.ckpt.1), resumed on 3 ranks.
        ckpt = os.path.join(self.tmp, "gpt.ckpt")
        rc, _, err, _ = run(launch(2, flags + ["--save", ckpt, "--save-every", "3", "--keep",
                                               "2"]))
        self.assertEqual(rc, 0, err)
        summary = os.path.join(self.tmp, "resumed.json")
        rc, _, err, _ = run(launch(3, flags + ["--resume", ckpt + ".1", "--summary", summary]))
        self.assertEqual(rc, 0, err)
        with open(summary) as f:
            resumed = json.load(f)["weights_digest"]
        self.assertEqual(resumed, got_f32[1][0])

    def test_init_from_gives_one_digest_on_every_split(self):
        """A run from exported weights (--init-from, GPT-2's architecture: biases, the tanh GELU,
        a padded vocabulary) gives the single process's weights on 2 and 3 ranks."""
        folder = self.text_folder()
        spec = "gpt:2-2-32-16,bias,gelu=tanh,pad=64"
        ckpt, weights = (os.path.join(self.tmp, n) for n in ("start.ckpt", "start.safetensors"))
        rc, _, err, _ = run(launch(1, ["--data", folder, "--model", spec, "--batch", "8",
                                       "--steps", "3", "--quiet", "--save", ckpt], mpi=False))
        self.assertEqual(rc, 0, err)
        rc, _, err, _ = run([mpi_testing.COHORT, "export", "--checkpoint", ckpt, "--format",
                             "safetensors", "-o", weights, "--quiet"])
        self.assertEqual(rc, 0, err)
        flags = ["--data", folder, "--model", spec, "--init-from", weights, "--batch", "12",
                 "--micro-batch", "2", "--steps", "4", "--optimizer", "adamw", "--lr", "0.003",
                 "--warmup-steps", "0", "--workers", "1", "--quiet", "--seed", str(SEED)]
        got = {}
        for ranks in (1, 2, 3):
            summary = os.path.join(self.tmp, f"init_{ranks}.json")
            rc, _, err, _ = run(launch(ranks, flags + ["--summary", summary], mpi=ranks > 1))
            self.assertEqual(rc, 0, f"{ranks} ranks:\n{err}")
            with open(summary) as f:
                s = json.load(f)
            got[ranks] = (s["weights_digest"], s["val_loss"])
        with self.subTest(seed=SEED):
            self.assertEqual(got[2], got[1])
            self.assertEqual(got[3], got[1])

    def test_default_leaves_give_one_digest_on_every_split(self):
        """Without --micro-batch or --workers, the MLP, the cnn, resnet20 and a language model
        each get one weights digest for --workers 1, 2, 3 and for mpirun -np 1, 2, 3: the
        default leaf is a function of the model, the batch and the precision only."""
        text = self.text_folder()
        # (data, flags, the default leaf's rows: several leaves each, a partial one for the cnn)
        cases = {
            "mlp": (mpi_testing.DATA, ["--batch", "256"], 64),
            "cnn": (mpi_testing.DATA, ["--model", "cnn", "--batch", "80"], 27),
            "resnet20": (mpi_testing.DATA, ["--model", "resnet20", "--batch", "128"], 64),
            "gpt": (text, ["--model", "gpt:2-2-64-32", "--batch", "36"], 12),
        }
        splits = [("workers", 1), ("workers", 2), ("workers", 3),
                  ("ranks", 1), ("ranks", 2), ("ranks", 3)]
        for name, (data, flags, rows) in cases.items():
            got = {}
            for kind, n in splits:
                summary = os.path.join(self.tmp, f"{name}_{kind}{n}.json")
                cmd = [mpi_testing.COHORT, "train", "--data", data, "--steps", "2", "--quiet",
                       "--seed", str(SEED), "--summary", summary] + flags
                if kind == "workers":
                    cmd += ["--workers", str(n)]
                else:
                    cmd = mpi_testing.MPIRUN + ["-np", str(n)] + cmd
                rc, out, err, _ = run(cmd)
                self.assertEqual(rc, 0, f"{' '.join(cmd)}\n{out}\n{err}")
                with open(summary) as f:
                    s = json.load(f)
                self.assertEqual(s["micro_batch"], rows, f"{name}, {kind} {n}")
                got[f"{kind} {n}"] = s["weights_digest"]
            with self.subTest(model=name, seed=SEED):
                self.assertEqual(len(set(got.values())), 1, got)

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
        rc, out, err, _ = run([mpi_testing.COHORT, "train", "--help"], timeout=30)
        self.assertEqual(rc, 0, err)
        self.assertIn("MPI", out)
        self.assertIn("mpirun", out)
        self.assertIn("--stall-timeout", out)


if __name__ == "__main__":
    main("mpi_test", __doc__)
