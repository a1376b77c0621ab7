#!/usr/bin/python3
"""A run driven from Python (`cohort.train`) against the same run from the CLI, side by side, and
the time of one on_step dispatch.

Each round runs, in alternating order, `cohort train --quiet --summary F FLAGS` and a fresh
`python3` that calls cohort.train(**FLAGS) with an on_step that keeps each step's loss (the
callback a notebook would pass); each reports its summary's samples_per_second (training steps
only: no data loading, no evaluation). Medians over the rounds and their ratio are printed.
Then `_cohort.dispatch_seconds` times on_step's dispatch directly: a step's line built as a run
builds it, handed from an engine thread to Python (GIL acquired, the dict built, the callback
called), over --dispatch-calls calls.

Usage: bench/python_vs_cli.py [--rounds 5] [--steps 300] [--batch 256] [--workers 2]
       [--model mlp:784-512-256-10] [--data /usr/share/datasets/fashion-mnist]
       [--build build/release]
Needs the release build with the Python package (PYTHONPATH is set to BUILD/python here).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def cli_rate(a, flags):
    with tempfile.TemporaryDirectory() as d:
        summary = os.path.join(d, "s.json")
        subprocess.run([os.path.join(a.build, "cohort"), "train", "--quiet", "--summary", summary,
                        *flags], check=True, timeout=600)
        with open(summary) as f:
            return json.load(f)["samples_per_second"]


PY_RUN = """
import json, sys
import cohort
kwargs = json.loads(sys.argv[1])
losses = []
s = cohort.train(on_step=lambda line: losses.append(line["loss"]), **kwargs)
assert len(losses) == s.steps
print(s.samples_per_second)
"""


def python_rate(a, kwargs, env):
    out = subprocess.run([sys.executable, "-c", PY_RUN, json.dumps(kwargs)], check=True,
                         timeout=600, env=env, capture_output=True, text=True).stdout
    return float(out.split()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--model", default="mlp:784-512-256-10")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--build", default="build/release")
    p.add_argument("--dispatch-calls", type=int, default=200000)
    a = p.parse_args()
    kwargs = dict(data=a.data, model=a.model, batch=a.batch, steps=a.steps, workers=a.workers,
                  seed=1, quiet=True)
    flags = []
    for k, v in kwargs.items():
        if k != "quiet":
            flags += ["--" + k, str(v)]
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.abspath(a.build), "python"))

    cli, py = [], []
    for r in range(a.rounds):
        order = [("cli", cli), ("python", py)]
        if r % 2:
            order.reverse()
        for name, rates in order:
            rates.append(cli_rate(a, flags) if name == "cli" else python_rate(a, kwargs, env))
        print(f"round {r + 1}: cli {cli[-1]:.0f}  python {py[-1]:.0f} samples/s", flush=True)
    mc, mp = statistics.median(cli), statistics.median(py)
    print(f"median: cli {mc:.0f}  python (on_step keeping the loss) {mp:.0f} samples/s  "
          f"python/cli {mp / mc:.3f}")

    sys.path.insert(0, env["PYTHONPATH"])
    import cohort._cohort as native

    losses = []
    for name, callback in (("returns None", lambda line: None),
                           ("keeps the loss", lambda line: losses.append(line["loss"]))):
        runs = [native.dispatch_seconds(callback, a.dispatch_calls) for _ in range(5)]
        print(f"on_step dispatch ({name}): median of 5 x {a.dispatch_calls} calls "
              f"{statistics.median(runs) * 1e6:.2f} us")


if __name__ == "__main__":
    main()
