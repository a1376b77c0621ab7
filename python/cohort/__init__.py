"""cohort from Python: train, evaluate and read the weights, NumPy arrays in and out.

The engine is the one `cohort train` runs (the native module _cohort): the same checks, messages,
files and weights digest. See docs/python.md.

    import cohort
    summary = cohort.train(model="mlp:784-128-10", data=(x_train, y_train, x_test, y_test),
                           batch=64, steps=200, on_step=lambda line: print(line["loss"]))
    model = cohort.load("run.ckpt")
    model.weights()["fc1.weight"]
"""

import os

from . import _cohort
from ._cohort import InputError, OutputError

__version__ = _cohort.__version__
__all__ = ["train", "load", "Model", "Summary", "Tokenizer", "pieces", "InputError", "OutputError",
           "version"]


def version():
    """What `cohort --version` prints: cohort's version and the libraries it runs on."""
    return _cohort.version_text()


class Summary:
    """A run's summary: the fields of `cohort train --summary`'s file as attributes
    (summary.weights_digest, summary.samples_per_second, summary.config["batch"], ...), and
    `stopped`: whether a callback (or Ctrl-C) ended the run before its planned steps."""

    def __init__(self, fields, stopped):
        self._fields = dict(fields)
        self.stopped = bool(stopped)

    def __getattr__(self, name):
        try:
            return self.__dict__["_fields"][name]
        except KeyError:
            raise AttributeError(f"Summary has no field {name!r}") from None

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._fields))

    def to_dict(self):
        """The fields as a dict (the --summary file's object), with "stopped"."""
        return dict(self._fields, stopped=self.stopped)

    def __repr__(self):
        shown = {k: self._fields[k] for k in ("model", "steps", "weights_digest") if k in self._fields}
        return f"Summary({shown}, stopped={self.stopped})"


def _value_args(flag, value):
    if isinstance(value, bool):  # a switch: --quiet=true, --nesterov=false
        return [f"{flag}={'true' if value else 'false'}"]
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    return [flag, repr(value) if isinstance(value, float) else str(value)]


def _config_args(config):
    """A job config as flags: a TOML file's path (--config) or a dict of its keys, nested
    ({"optimizer": {"lr": 0.1}}) or dotted ({"optimizer.lr": 0.1})."""
    if config is None:
        return []
    if isinstance(config, (str, os.PathLike)):
        return ["--config", os.fspath(config)]
    if not isinstance(config, dict):
        raise InputError(f"config: expected a TOML file's path or a dict, found {type(config).__name__}")
    keys = _cohort.config_keys()
    args = []

    def walk(prefix, table):
        for key, value in table.items():
            name = f"{prefix}{key}"
            if isinstance(value, dict):
                walk(name + ".", value)
            elif name in keys:
                args.extend(_value_args(keys[name], value))
            else:
                raise InputError(f"config: unknown key '{name}' (expected one of: {', '.join(sorted(keys))})")

    walk("", config)
    return args


def train(config=None, *, data=None, on_step=None, on_epoch=None, **flags):
    """Trains as `cohort train` does and returns its Summary.

    config: a TOML job file's path or a dict of its keys; flags: `cohort train`'s flags by name
    (model="cnn", batch=256, precision="bf16", micro_batch=32, save="run.ckpt", quiet=True),
    which replace the config's keys. data: a folder (as --data; None: --data's default), or
    arrays used in memory: (x_train, y_train, x_test, y_test) (uint8 or float32 samples of shape
    (N, features), (N, H, W) or (N, C, H, W), integer labels) or, for a language model,
    (train_tokens, val_tokens) (1-d unsigned integers).

    on_step(line) is called after every step with the fields `--metrics` writes for it with
    `--log-every 1` (kind "step" or "skip"); on_epoch(line) after every epoch and --eval-every
    evaluation (kind "epoch" or "eval"). A callback that returns False stops the run, as Ctrl-C
    does: after that step (after an epoch, before the next), saving if `save` is set; the
    Summary then has stopped=True. Ctrl-C stops the run that way and then raises
    KeyboardInterrupt. Bad input raises InputError (a ValueError) with the CLI's message; a file
    that could not be written, OutputError (an OSError).
    """
    args = _config_args(config)
    arrays = None
    if isinstance(data, (str, os.PathLike)):
        args += ["--data", os.fspath(data)]
    elif data is not None:
        arrays = data
    for name, value in flags.items():
        args += _value_args("--" + name.replace("_", "-"), value)

    on_line = None
    if on_step is not None or on_epoch is not None:
        step_kinds = ("step", "skip")

        def on_line(line):
            callback = on_step if line["kind"] in step_kinds else on_epoch
            return None if callback is None else callback(line)

    result = _cohort.train(args, arrays, on_line)
    return Summary(result["summary"] or {}, result["stopped"])


class Model:
    """A checkpoint's model (cohort.load): its weights, evaluation, logits and text."""

    def __init__(self, checkpoint):
        self._ck = _cohort.Checkpoint(os.fspath(checkpoint))

    @property
    def spec(self):
        """The model spec the checkpoint was trained with ("cnn", "gpt:4-4-128-64", ...)."""
        return self._ck.model

    @property
    def step(self):
        """The steps trained."""
        return self._ck.step

    def weights(self):
        """The PyTorch state_dict `cohort export --format safetensors` writes, as a dict of
        NumPy arrays under the same names, in the same order (float32; num_batches_tracked int64)."""
        return self._ck.weights()

    def evaluate(self, data, workers=0):
        """`cohort eval`'s figures on `data` (a folder or arrays, as train's): a dict with
        test_loss, test_accuracy and weights_digest (a language model's also val_loss, val_bpc)."""
        return self._ck.evaluate(data, workers)

    def logits(self, x):
        """A classifier's logits, float32 (N, classes), for samples x of the model's input shape
        (uint8 pixels, scaled by 1/255, or float32 features), as `cohort eval --logits` computes them."""
        return self._ck.logits(x)

    def sample(self, prompt="", tokens=500, temperature=1.0, top_k=0, seed=1, tokenizer=None):
        """A language model's text, as `cohort sample` prints it: the prompt, then `tokens` tokens
        drawn one at a time (for a model of token arrays: token ids separated by spaces, or text
        through `tokenizer`, a folder with GPT-2's vocab.json and merges.txt). A str: bytes that
        are not UTF-8 (tokens that end inside a character) become U+FFFD."""
        folder = "" if tokenizer is None else os.fspath(tokenizer)
        text = self._ck.sample(prompt, tokens, temperature, top_k, seed, folder)
        return text.decode("utf-8", errors="replace")

    def __repr__(self):
        return f"Model({self.spec!r}, step={self.step})"


class Tokenizer:
    """GPT-2's byte-level BPE from a folder with its vocab.json and merges.txt (what
    `cohort sample --tokenizer` reads): encode(text) -> uint32 token ids (text a str, as UTF-8,
    or bytes: any bytes encode), decode(ids) -> bytes, len() the vocabulary's size."""

    def __init__(self, folder):
        self._bpe = _cohort.Tokenizer(os.fspath(folder))

    def encode(self, text):
        return self._bpe.encode(text)

    def decode(self, ids):
        return self._bpe.decode([int(i) for i in ids])

    def __len__(self):
        return len(self._bpe)


def pieces(text):
    """GPT-2's pre-tokenizer: the pieces of `text` (a str, as UTF-8, or bytes), as bytes, in order."""
    return _cohort.pieces(text)


def load(checkpoint):
    """The model of a checkpoint file (`cohort train --save`), checked as `cohort eval` checks it."""
    return Model(checkpoint)
