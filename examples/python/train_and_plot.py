"""Trains an MLP on Fashion-MNIST from NumPy arrays, plots the loss its callbacks saw, and reads the
weights back.

    PYTHONPATH=build/release/python python3 examples/python/train_and_plot.py \
        [--data /usr/share/datasets/fashion-mnist] [--steps 600] [--out runs/python_loss.png]

The four IDX files of --data (train-images-idx3-ubyte[.gz], ...) are read into arrays here, to show
arrays going in; cohort.train(data=FOLDER) reads such a folder itself.
"""

import argparse
import gzip
import os

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
import numpy as np

import cohort


def read_idx(folder, name):
    """One IDX file of `folder` (`name` or `name.gz`) as a uint8 array of its shape."""
    path = os.path.join(folder, name)
    opener = open
    if not os.path.exists(path):
        path, opener = path + ".gz", gzip.open
    with opener(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--out", default="runs/python_loss.png")
    a = p.parse_args()

    arrays = (read_idx(a.data, "train-images-idx3-ubyte"), read_idx(a.data, "train-labels-idx1-ubyte"),
              read_idx(a.data, "t10k-images-idx3-ubyte"), read_idx(a.data, "t10k-labels-idx1-ubyte"))
    steps, losses = [], []

    def on_step(line):
        steps.append(line["step"])
        losses.append(line["loss"])

    checkpoint = os.path.join(os.path.dirname(a.out) or ".", "python_mlp.ckpt")
    os.makedirs(os.path.dirname(checkpoint), exist_ok=True)
    summary = cohort.train(model="mlp:784-256-10", data=arrays, batch=128, steps=a.steps, seed=1,
                           save=checkpoint, quiet=True, on_step=on_step)
    print(f"{summary.steps} steps, {summary.samples_per_second:.0f} samples/s, test accuracy "
          f"{summary.test_accuracy:.4f}, weights digest {summary.weights_digest}")

    plt.figure(figsize=(7, 4))
    plt.plot(steps, losses, linewidth=0.8)
    plt.xlabel("step")
    plt.ylabel("training loss (the step's batch)")
    plt.title(f"cohort.train: mlp:784-256-10 on {os.path.basename(os.path.normpath(a.data))}")
    plt.savefig(a.out, dpi=100, bbox_inches="tight")
    print(f"loss curve -> {a.out}")

    model = cohort.load(checkpoint)
    for name, value in model.weights().items():
        print(f"  {name}: {value.dtype} {value.shape}")
    print(f"evaluated again: {model.evaluate(arrays)['test_accuracy']:.4f}")


if __name__ == "__main__":
    main()
