#!/usr/bin/python3
"""Loads every OUT/*.safetensors that `cohort export` wrote into a PyTorch model rebuilt from the
spec in the file's metadata (strict: every name and shape of its state_dict, bn buffers
included), runs it in eval mode on the test set and requires its logits within 1e-4 of
`cohort eval --logits` and its accuracy equal to cohort's. The file is read by hand (no
`safetensors` package): 8-byte little-endian header length, JSON header, raw tensor bytes (F32,
and I64 for bn's num_batches_tracked).
Models: the peer's MLP, CNN and ResNet20 (resnet20: the class of bench/peers/torch_peer.py
itself); any other layer list as an nn.Sequential, a `res` layer torch_peer.py's BasicBlock.
Usage: check_safetensors.py OUT_DIR DATA_DIR. Exits 77 (skip) when torch is not installed."""
import json
import os
import re
import sys

from export_check_util import SKIP, check_files

try:
    import numpy as np
    import torch
    import torch.nn as nn
except ImportError as e:
    print(f"SKIP: {e} (scripts/setup.sh installs python3-torch and python3-numpy)")
    sys.exit(SKIP)

# The PyTorch peer: importing it defines its models and constants, and runs nothing.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench",
                                "peers"))
import torch_peer  # noqa: E402

DTYPES = {"F32": "<f4", "I64": "<i8"}


def read_safetensors(path):
    """{name: tensor} and the metadata, by the format's definition."""
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    metadata = header.pop("__metadata__")
    tensors = {}
    for name, e in header.items():
        assert e["dtype"] in DTYPES, (name, e["dtype"])
        dtype = np.dtype(DTYPES[e["dtype"]])
        begin, end = e["data_offsets"]
        assert (end - begin) == dtype.itemsize * int(np.prod(e["shape"])), (name, e)
        a = np.frombuffer(raw, dtype=dtype, count=(end - begin) // dtype.itemsize,
                          offset=8 + n + begin)
        tensors[name] = torch.from_numpy(a.reshape(e["shape"]).copy())
    return tensors, metadata


class PeerMlp(nn.Module):
    """bench/peers/torch_peer.py's MLP for any sizes: fc1, fc2, ... with ReLU between."""

    def __init__(self, sizes):
        super().__init__()
        self.sizes = sizes
        for i in range(1, len(sizes)):
            setattr(self, f"fc{i}", nn.Linear(sizes[i - 1], sizes[i]))

    def forward(self, x):
        x = x.reshape(x.shape[0], self.sizes[0])
        for i in range(1, len(self.sizes)):
            x = getattr(self, f"fc{i}")(x)
            if i + 1 < len(self.sizes):
                x = torch.relu(x)
        return x


class PeerCnn(nn.Module):
    """bench/peers/torch_peer.py's CNN, module for module."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 32, 5)
        self.c2 = nn.Conv2d(32, 64, 5)
        self.fc1 = nn.Linear(1024, 256)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x):
        x = x.reshape(x.shape[0], 1, 28, 28)
        x = torch.max_pool2d(torch.relu(self.c1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.c2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class GlobalAvgPool(nn.Module):
    """cohort's gap: (N, C, H, W) -> (N, C), the mean over H and W (no parameters)."""

    def forward(self, x):
        return x.mean(dim=(2, 3))


def sequential(spec, input_shape):
    """A layer list as nn.Sequential: layer i is module i (the export's 'sequential' naming);
    bn is BatchNorm2d on an image, BatchNorm1d on a flat input; res(OC[,S]) is the peer's
    BasicBlock(C, OC, S) (members c1, b1, c2, b2 and short.0, short.1)."""
    modules = []
    flat = input_shape[1:] == [1, 1]
    shape = input_shape[:1] if flat else list(input_shape)  # (C, H, W), or (F,) once flat
    for token in spec.split("-"):
        m = re.fullmatch(r"(\w+)(?:\(([^)]*)\))?", token)
        kind, args = m.group(1), [a for a in (m.group(2) or "").split(",") if a]
        if kind == "conv":
            oc, k = int(args[0]), int(args[1])
            stride = int(args[2]) if len(args) > 2 else 1
            pad = int(args[3]) if len(args) > 3 else 0
            bias = len(args) <= 4 or args[4] != "nobias"  # conv(OC,K,S,P,nobias): bias=False
            modules.append(nn.Conv2d(shape[0], oc, k, stride, pad, bias=bias))
            shape = [oc] + [(d + 2 * pad - k) // stride + 1 for d in shape[1:]]
        elif kind in ("maxpool", "avgpool"):
            k = int(args[0])
            stride = int(args[1]) if len(args) > 1 else k
            modules.append((nn.MaxPool2d if kind == "maxpool" else nn.AvgPool2d)(k, stride))
            shape = [shape[0]] + [(d - k) // stride + 1 for d in shape[1:]]
        elif kind == "bn":
            modules.append((nn.BatchNorm2d if len(shape) == 3 else nn.BatchNorm1d)(shape[0]))
        elif kind == "res":
            oc = int(args[0])
            stride = int(args[1]) if len(args) > 1 else 1
            modules.append(torch_peer.BasicBlock(shape[0], oc, stride))
            shape = [oc] + [(d + 2 - 3) // stride + 1 for d in shape[1:]]
        elif kind == "gap":
            modules.append(GlobalAvgPool())
            shape = shape[:1]
        elif kind == "relu":
            modules.append(nn.ReLU())
        elif kind == "flatten":
            modules.append(nn.Flatten())
            shape = [int(np.prod(shape))]
        elif kind == "dropout":
            modules.append(nn.Dropout(float(args[0])))  # the identity in eval()
        elif kind == "linear":
            modules.append(nn.Linear(shape[0], int(args[0])))
            shape = [int(args[0])]
        else:
            raise ValueError(f"unknown layer {token!r} in {spec!r}")
    return nn.Sequential(*modules)


def build(metadata):
    spec = metadata["model"]
    if spec == "cnn":
        assert metadata["naming"] == "peer"
        return PeerCnn()
    if spec == "resnet20":
        assert metadata["naming"] == "peer"
        return torch_peer.ResNet20()
    if spec.startswith("mlp:"):
        assert metadata["naming"] == "peer"
        return PeerMlp([int(s) for s in spec[4:].split("-")])
    assert metadata["naming"] == "sequential"
    return sequential(spec, [int(d) for d in metadata["input"].split(",")])


def evaluate(path, x):
    tensors, metadata = read_safetensors(path)
    model = build(metadata)
    model.load_state_dict(tensors, strict=True)  # every name and shape must match
    model.eval()  # bn: the running statistics
    tracked = {int(t) for name, t in tensors.items() if name.endswith(".num_batches_tracked")}
    if tracked:
        assert len(tracked) == 1, tracked  # the same count in every bn layer
        print(f"{os.path.basename(path)}: num_batches_tracked {tracked.pop()} in "
              f"{sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())} "
              f"bn layers")
    with torch.no_grad():
        logits = torch.cat([model(torch.from_numpy(x[i:i + 1000]))
                            for i in range(0, x.shape[0], 1000)]).numpy()
    return logits, metadata


def main():
    torch.set_num_threads(2)
    return check_files(sys.argv[1], sys.argv[2], ".safetensors", evaluate)


if __name__ == "__main__":
    sys.exit(main())
