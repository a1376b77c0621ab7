"""The Python package against the binary: the same digests from arrays as from their .npy files,
the CLI's messages as exceptions, callbacks that stop a run, Ctrl-C, and weights, evaluation,
logits and samples equal to what `cohort export`, `cohort eval` and `cohort sample` give.

Run by ctest (tests/python/CMakeLists.txt) with PYTHONPATH at the build's python/ folder and
COHORT_BIN the `cohort` binary of the same build. Seeds are fixed and printed in the names.
"""

import json
import os
import signal
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import cohort

COHORT = os.environ["COHORT_BIN"]
SEED = 7  # the data's generator and every run's --seed


def run_cli(*args, check=True):
    p = subprocess.run([COHORT, *map(str, args)], capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"cohort {' '.join(map(str, args))}: exit {p.returncode}\n{p.stderr}")
    return p


def cli_summary(tmp_path, *args):
    path = tmp_path / "cli-summary.json"
    run_cli("train", *args, "--quiet", "--summary", path)
    return json.loads(path.read_text())


def images(seed=SEED, train=96, test=40, classes=4):
    """Samples of 1x8x8 uint8 pixels whose class sets their mean brightness (learnable)."""
    rng = np.random.default_rng(seed)

    def split(n):
        y = rng.integers(0, classes, n).astype(np.int64)
        x = (rng.integers(0, 40, (n, 1, 8, 8)) + 50 * y[:, None, None, None]).astype(np.uint8)
        return x, y

    return (*split(train), *split(test))


def save_npy_folder(folder, arrays):
    folder.mkdir()
    for name, a in zip(("train_x", "train_y", "test_x", "test_y"), arrays):
        np.save(folder / f"{name}.npy", a)
    return folder


def tokens(seed=SEED, train=2000, val=400, vocab=17):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, vocab, train).astype(np.uint16),
            rng.integers(0, vocab, val).astype(np.uint16))


MLP = dict(model="mlp:64-32-4", batch=16, steps=6, seed=SEED, lr=0.05)
GPT = dict(model="gpt:1-2-16-8", batch=4, steps=4, seed=SEED)


def flags(d):
    out = []
    for k, v in d.items():
        out += ["--" + k.replace("_", "-"), str(v)]
    return out


@pytest.mark.parametrize("workers", [1, 2])
def test_mlp_from_arrays_has_the_digest_of_their_npy_files(tmp_path, workers):
    arrays = images()
    folder = save_npy_folder(tmp_path / "data", arrays)
    cli = cli_summary(tmp_path, "--data", folder, *flags(MLP), "--workers", workers)
    py = cohort.train(data=arrays, quiet=True, workers=workers, **MLP)
    assert py.weights_digest == cli["weights_digest"]
    assert py.steps == MLP["steps"] and not py.stopped
    assert py.config["data"] == "(arrays)"


def test_bf16_from_arrays_has_the_digest_of_their_npy_files(tmp_path):
    arrays = images()
    folder = save_npy_folder(tmp_path / "data", arrays)
    bf16 = dict(MLP, precision="bf16")
    cli = cli_summary(tmp_path, "--data", folder, *flags(bf16), "--allow-emulated-bf16")
    py = cohort.train(data=arrays, quiet=True, allow_emulated_bf16=True, **bf16)
    assert py.weights_digest == cli["weights_digest"]


def test_language_model_from_token_arrays_has_the_digest_of_their_npy_files(tmp_path):
    train_tokens, val_tokens = tokens()
    folder = tmp_path / "text"
    folder.mkdir()
    np.save(folder / "train_tokens.npy", train_tokens)
    np.save(folder / "val_tokens.npy", val_tokens)
    cli = cli_summary(tmp_path, "--data", folder, *flags(GPT))
    py = cohort.train(data=(train_tokens, val_tokens), quiet=True, **GPT)
    assert py.weights_digest == cli["weights_digest"]
    # A folder given as data reads it as --data does.
    assert cohort.train(data=folder, quiet=True, **GPT).weights_digest == cli["weights_digest"]


def test_a_dict_config_and_a_toml_file_train_alike(tmp_path):
    arrays = images()
    toml = tmp_path / "job.toml"
    toml.write_text('[model]\nspec = "mlp:64-32-4"\n[run]\nbatch = 16\nsteps = 5\nseed = 7\n'
                    '[optimizer]\nlr = 0.05\n')
    from_file = cohort.train(str(toml), data=arrays, quiet=True)
    nested = {"model": {"spec": "mlp:64-32-4"}, "run": {"batch": 16, "steps": 5, "seed": 7},
              "optimizer": {"lr": 0.05}}
    from_dict = cohort.train(nested, data=arrays, quiet=True)
    dotted = cohort.train({"model.spec": "mlp:64-32-4", "run.batch": 16, "run.steps": 5,
                           "run.seed": 7, "optimizer.lr": 0.05}, data=arrays, quiet=True)
    assert from_file.weights_digest == from_dict.weights_digest == dotted.weights_digest
    # A flag replaces the config's key.
    assert cohort.train(nested, data=arrays, quiet=True, steps=3).steps == 3


def test_a_resume_equals_the_unbroken_run(tmp_path):
    arrays = images()
    whole = cohort.train(data=arrays, quiet=True, **dict(MLP, steps=8))
    ck = tmp_path / "run.ckpt"
    cohort.train(data=arrays, quiet=True, save=ck, **dict(MLP, steps=4))
    resumed = cohort.train(data=arrays, quiet=True, resume=ck, **dict(MLP, steps=8))
    assert resumed.weights_digest == whole.weights_digest


def cli_error(*args):
    p = run_cli("train", *args, check=False)
    assert p.returncode == 2, p.stderr
    return p.stderr.strip().removeprefix("cohort: error: ").removeprefix("cohort: ")


@pytest.mark.parametrize("case", ["batch_zero", "unknown_model", "unknown_flag"])
def test_bad_flags_raise_the_clis_message(tmp_path, case):
    folder = save_npy_folder(tmp_path / "data", images())
    given = {"batch_zero": dict(MLP, batch=0), "unknown_model": dict(MLP, model="mlp:64-x"),
             "unknown_flag": dict(MLP, no_such_flag=1)}[case]
    expected = cli_error("--data", folder, *flags(given), "--quiet")
    with pytest.raises(cohort.InputError) as e:
        cohort.train(data=folder, quiet=True, **given)
    assert str(e.value) == expected
    assert isinstance(e.value, ValueError)


def test_arrays_are_checked_as_their_files_are():
    x, y, xt, yt = images()
    with pytest.raises(ValueError, match=r"x_train: dtype: expected uint8 .* or float32"):
        cohort.train(data=(x.astype(np.float64), y, xt, yt), quiet=True, **MLP)
    with pytest.raises(ValueError, match=r"y_test: shape: expected \(40,\) \(the sample count"):
        cohort.train(data=(x, y, xt, yt[:-1]), quiet=True, **MLP)
    with pytest.raises(ValueError, match=r"y_train: label 0: expected a class in"):
        bad = y.copy()
        bad[0] = -1
        cohort.train(data=(x, bad, xt, yt), quiet=True, **MLP)
    with pytest.raises(ValueError, match=r"x_train: sample 3 feature 5: expected a finite float"):
        xf = x.reshape(len(x), -1).astype(np.float32)
        xf[3, 5] = np.nan
        cohort.train(data=(xf, y, xt.reshape(len(xt), -1).astype(np.float32), yt), quiet=True,
                     **MLP)
    with pytest.raises(ValueError, match=r"data: expected two token arrays"):
        cohort.train(data=(x, y, xt, yt), quiet=True, **GPT)
    with pytest.raises(ValueError, match=r"data: expected \(x_train, y_train, x_test, y_test\)"):
        cohort.train(data=(x, y, xt), quiet=True, **MLP)
    with pytest.raises(ValueError, match=r"config: unknown key 'run.no_such_key'"):
        cohort.train({"run": {"no_such_key": 1}}, data=(x, y, xt, yt), quiet=True)


def test_a_save_that_fails_after_the_checks_raises_output_error(tmp_path):
    """The CLI's exit 74: the save folder, checked before the run, is gone when the run saves."""
    folder = tmp_path / "ck"
    folder.mkdir()

    def on_step(line):
        if line["step"] == 2:
            folder.rmdir()

    with pytest.raises(cohort.OutputError, match=r"run.ckpt: cannot create") as e:
        cohort.train(data=images(), quiet=True, save=folder / "run.ckpt", on_step=on_step, **MLP)
    assert isinstance(e.value, OSError)


def test_a_callback_returning_false_stops_the_run_and_it_saves(tmp_path):
    ck = tmp_path / "run.ckpt"
    seen = []

    def on_step(line):
        seen.append(line)
        return line["step"] < 3

    s = cohort.train(data=images(), quiet=True, save=ck, on_step=on_step, **MLP)
    assert s.stopped and s.steps == 3
    assert [line["step"] for line in seen] == [1, 2, 3]
    assert set(seen[0]) >= {"kind", "step", "epoch", "loss", "lr", "elapsed_s"}
    assert cohort.load(ck).step == 3


def test_step_lines_are_the_metrics_files_with_log_every_1(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    steps, epochs = [], []
    cohort.train(data=images(), quiet=True, metrics=metrics, log_every=1, on_step=steps.append,
                 on_epoch=epochs.append, **dict(MLP, steps=0, epochs=2))
    written = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert steps == [w for w in written if w["kind"] == "step"]
    assert epochs == [w for w in written if w["kind"] == "epoch"]
    assert len(epochs) == 2


def test_an_epoch_callback_returning_false_stops_before_the_next_epoch():
    s = cohort.train(data=images(), quiet=True, on_epoch=lambda line: False,
                     **dict(MLP, steps=0, epochs=3))
    assert s.stopped and s.steps == 96 // 16


def test_an_exception_in_a_callback_stops_the_run_and_is_raised():
    def on_step(line):
        if line["step"] == 2:
            raise RuntimeError("from the callback")

    with pytest.raises(RuntimeError, match="from the callback"):
        cohort.train(data=images(), quiet=True, on_step=on_step, **MLP)


def test_ctrl_c_stops_after_the_step_saves_and_raises_keyboard_interrupt(tmp_path):
    ck = tmp_path / "run.ckpt"
    script = textwrap.dedent(f"""
        import os, signal, sys
        import numpy as np
        import cohort
        rng = np.random.default_rng({SEED})
        x = rng.integers(0, 255, (64, 1, 8, 8)).astype(np.uint8)
        y = rng.integers(0, 4, 64)
        def on_step(line):
            if line["step"] == 2:
                os.kill(os.getpid(), signal.SIGINT)
        try:
            cohort.train(data=(x, y, x, y), model="mlp:64-16-4", batch=8, steps=100000, seed=1,
                         quiet=True, save={str(ck)!r}, on_step=on_step)
        except KeyboardInterrupt:
            print("KeyboardInterrupt")
            sys.exit(0)
        print("no KeyboardInterrupt")
        sys.exit(1)
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120, env=os.environ)
    assert p.returncode == 0, p.stdout + p.stderr
    step = cohort.load(ck).step
    assert 2 <= step < 100000


def read_safetensors(path):
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__")
    body = data[8 + n:]
    out = {}
    for name, t in header.items():  # json keeps the file's order
        begin, end = t["data_offsets"]
        dtype = {"F32": np.float32, "I64": np.int64}[t["dtype"]]
        out[name] = np.frombuffer(body[begin:end], dtype=dtype).reshape(t["shape"])
    return out


@pytest.mark.parametrize("model", ["mlp", "cnn_with_bn"])
def test_weights_are_what_export_writes(tmp_path, model):
    ck = tmp_path / "run.ckpt"
    spec = {"mlp": "mlp:64-32-4",
            "cnn_with_bn": "conv(4,3,1,1)-bn-relu-maxpool(2)-flatten-linear(4)"}[model]
    cohort.train(data=images(), quiet=True, save=ck, **dict(MLP, model=spec))
    out = tmp_path / "w.safetensors"
    run_cli("export", "--checkpoint", ck, "--format", "safetensors", "-o", out, "--quiet")
    exported = read_safetensors(out)
    weights = cohort.load(ck).weights()
    assert list(weights) == list(exported)
    for name, value in exported.items():
        assert weights[name].dtype == value.dtype and weights[name].shape == value.shape, name
        assert np.array_equal(weights[name], value), name


def test_evaluate_and_logits_are_what_eval_computes(tmp_path):
    arrays = images()
    folder = save_npy_folder(tmp_path / "data", arrays)
    ck = tmp_path / "run.ckpt"
    cohort.train(data=arrays, quiet=True, save=ck, **MLP)
    summary, logits = tmp_path / "eval.json", tmp_path / "logits.npy"
    run_cli("eval", "--checkpoint", ck, "--data", folder, "--summary", summary, "--logits", logits,
            "--quiet")
    cli = json.loads(summary.read_text())
    model = cohort.load(ck)
    for data in (arrays, folder):
        e = model.evaluate(data)
        assert e["weights_digest"] == cli["weights_digest"]
        assert e["test_loss"] == cli["test_loss"] and e["test_accuracy"] == cli["test_accuracy"]
    assert np.array_equal(model.logits(arrays[2]), np.load(logits))
    with pytest.raises(ValueError, match=r"x: expected samples of shape"):
        model.logits(arrays[2].reshape(40, 8, 8)[:, :4, :])


def test_sample_is_what_the_cli_prints(tmp_path):
    ck = tmp_path / "gpt.ckpt"
    cohort.train(data=tokens(), quiet=True, save=ck, **GPT)
    model = cohort.load(ck)
    text = model.sample("1 2 3", tokens=12, temperature=0.8, top_k=5, seed=3)
    cli = run_cli("sample", "--checkpoint", ck, "--prompt", "1 2 3", "--tokens", 12,
                  "--temperature", 0.8, "--top-k", 5, "--seed", 3, "--quiet").stdout
    assert text == cli
    with pytest.raises(ValueError, match=r"--temperature"):
        model.sample("1", tokens=2, temperature=-1)
    with pytest.raises(ValueError, match=r"expected a classifier's checkpoint"):
        model.logits(np.zeros((2, 8), np.float32))


def test_a_missing_checkpoint_raises_the_clis_message(tmp_path):
    missing = tmp_path / "none.ckpt"
    expected = run_cli("eval", "--checkpoint", missing, "--data", tmp_path, check=False)
    with pytest.raises(ValueError) as e:
        cohort.load(missing)
    assert str(e.value) in expected.stderr


def run_script(name, *args):
    scripts = os.path.join(os.path.dirname(__file__), "..", "..", "scripts")
    p = subprocess.run([sys.executable, os.path.join(scripts, name), *map(str, args)],
                       capture_output=True, text=True, timeout=300, env=os.environ)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_train_bpe_learns_the_most_frequent_pairs_and_the_tokenizer_reads_them(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("ab ab ab ab cd")
    # Pieces "ab", " ab" x3, " cd": (a, b) is seen 4 times, then (Ġ, ab) 3 times; the rest once.
    run_script("train_bpe.py", text, tmp_path / "bpe", "--merges", 10)
    assert (tmp_path / "bpe" / "merges.txt").read_text().splitlines() == ["#version: 0.2", "a b",
                                                                          "Ġ ab"]
    vocab = json.loads((tmp_path / "bpe" / "vocab.json").read_text())
    assert (vocab["ab"], vocab["Ġab"], vocab["<|endoftext|>"]) == (256, 257, 258)
    tok = cohort.Tokenizer(tmp_path / "bpe")
    assert len(tok) == 259
    assert list(tok.encode("ab abc")) == [256, 257, ord("c")]
    data = bytes(range(256)) + "é ab".encode()
    assert tok.decode(tok.encode(data)) == data
    assert b"".join(cohort.pieces("don't 12")) == b"don't 12"
    assert cohort.pieces("don't 12") == [b"don", b"'t", b" 12"]
    with pytest.raises(ValueError, match="expected token ids below 259"):
        tok.decode([259])


def test_encoded_text_trains_and_samples_through_the_tokenizer(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat. " * 200)
    run_script("train_bpe.py", text, tmp_path / "bpe", "--merges", 30)
    run_script("encode_tokens.py", tmp_path / "bpe", text, tmp_path / "tokens")
    train_tokens = np.load(tmp_path / "tokens" / "train_tokens.npy")
    assert train_tokens.dtype == np.uint16
    ck = tmp_path / "gpt.ckpt"
    cohort.train(data=tmp_path / "tokens", quiet=True, save=ck, **GPT)
    model = cohort.load(ck)
    got = model.sample("the cat", tokens=10, seed=2, tokenizer=tmp_path / "bpe")
    cli = subprocess.run([COHORT, "sample", "--checkpoint", ck, "--prompt", "the cat", "--tokens",
                          "10", "--seed", "2", "--tokenizer", tmp_path / "bpe", "--quiet"],
                         capture_output=True, check=True, timeout=60).stdout
    assert got == cli.decode("utf-8", errors="replace") and got.startswith("the cat")
