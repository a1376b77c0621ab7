#!/usr/bin/python3
"""Checks every OUT/*.onnx that `cohort export` wrote: onnx.checker with full_check (shape
inference included), the interface (input "input" with a symbolic batch dimension, output
"logits"), then runs it with a NumPy evaluator of exactly the operators cohort emits (in float64;
the layer lists': Gemm, Conv, BatchNormalization, MaxPool, AveragePool, GlobalAveragePool, Relu,
Add, Flatten; the language model's besides: Shape, Slice, Concat, Gather, Reshape, Transpose,
MatMul, Sub, Mul, Div, Sqrt, Erf, Tanh, ReduceMean, Softmax) and requires its logits within 1e-4 of
`cohort eval --logits` and its accuracy equal to cohort's. check_gpt.py runs the language
model's file with run() here.
Usage: check_onnx.py OUT_DIR DATA_DIR. Exits 77 (skip) when onnx or numpy is not installed."""
import math
import sys

from export_check_util import SKIP, check_files

try:
    import numpy as np
    import onnx
    from onnx import numpy_helper
except ImportError as e:
    print(f"SKIP: {e} (scripts/setup.sh installs python3-onnx and python3-numpy)")
    sys.exit(SKIP)


def attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def windows(x, k, stride, pad=(0, 0, 0, 0)):
    """Yields (kh, kw, view): x (N, C, H, W) zero-padded by pad (top, left, bottom, right),
    view (N, C, OH, OW) = the input under kernel position (kh, kw) for every output pixel."""
    x = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[2]), (pad[1], pad[3])))
    oh = (x.shape[2] - k[0]) // stride[0] + 1
    ow = (x.shape[3] - k[1]) // stride[1] + 1
    for kh in range(k[0]):
        for kw in range(k[1]):
            yield kh, kw, x[:, :, kh:kh + stride[0] * oh:stride[0], kw:kw + stride[1] * ow:stride[1]]


def gemm(a, b, c, at):
    """c is None for a Gemm with two inputs (A, B): ONNX's C is optional."""
    assert at.get("transA", 0) == 0
    b = b.T if at.get("transB", 0) else b
    y = at.get("alpha", 1.0) * (a @ b)
    return y if c is None else y + at.get("beta", 1.0) * c


def conv(x, w, b, at):
    """b is None for a Conv with two inputs (X, W): ONNX's bias is optional."""
    assert at.get("group", 1) == 1 and at.get("dilations", [1, 1]) == [1, 1]
    k = at.get("kernel_shape", list(w.shape[2:]))
    out = 0
    for kh, kw, v in windows(x, k, at.get("strides", [1, 1]), at.get("pads", [0, 0, 0, 0])):
        out = out + np.einsum("nchw,oc->nohw", v, w[:, :, kh, kw], optimize=True)
    return out if b is None else out + b.reshape(1, -1, 1, 1)


def batch_norm(x, scale, bias, mean, var, at):
    """Inference (opset 9-14 without training_mode): per channel, axis 1 of (N, C, ...)."""
    assert set(at) <= {"epsilon", "momentum"}, at
    c = (1, -1) + (1,) * (x.ndim - 2)
    x = (x - mean.reshape(c)) / np.sqrt(var.reshape(c) + at.get("epsilon", 1e-5))
    return x * scale.reshape(c) + bias.reshape(c)


def pool(x, at, reduce):
    assert at.get("pads", [0, 0, 0, 0]) == [0, 0, 0, 0] and at.get("ceil_mode", 0) == 0
    views = [v for _, _, v in windows(x, at["kernel_shape"], at.get("strides", [1, 1]))]
    return reduce(np.stack(views), axis=0)


def slice_(data, starts, ends, axes=None, steps=None):
    """Slice (opset 13) with its inputs; NumPy's slices clamp starts and ends as ONNX's do."""
    assert steps is None
    axes = range(len(starts)) if axes is None else axes
    index = [slice(None)] * data.ndim
    for a, b, e in zip(axes, starts, ends):
        index[int(a)] = slice(int(b), int(e))
    return data[tuple(index)]


def reshape(data, shape):
    assert 0 not in shape.tolist(), "a 0 (copy a dimension) is not emitted"
    return data.reshape(shape.tolist())


def softmax(x, axis):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


ERF = np.frompyfunc(math.erf, 1, 1)

OPS = {
    "Gemm": lambda ins, at: gemm(ins[0], ins[1], ins[2] if len(ins) > 2 else None, at),
    "Conv": lambda ins, at: conv(ins[0], ins[1], ins[2] if len(ins) > 2 else None, at),
    "BatchNormalization": lambda ins, at: batch_norm(*ins, at),
    "MaxPool": lambda ins, at: pool(ins[0], at, np.max),
    "AveragePool": lambda ins, at: pool(ins[0], at, np.mean),
    "GlobalAveragePool": lambda ins, at: ins[0].mean(axis=(2, 3), keepdims=True),
    "Relu": lambda ins, at: np.maximum(ins[0], 0),
    "Add": lambda ins, at: ins[0] + ins[1],
    "Flatten": lambda ins, at: ins[0].reshape(int(np.prod(ins[0].shape[:at.get("axis", 1)])), -1),
    "Shape": lambda ins, at: np.array(ins[0].shape, dtype=np.int64),
    "Slice": lambda ins, at: slice_(*ins),
    "Concat": lambda ins, at: np.concatenate(ins, axis=at["axis"]),
    "Gather": lambda ins, at: np.take(ins[0], ins[1], axis=at.get("axis", 0)),
    "Reshape": lambda ins, at: reshape(ins[0], ins[1]),
    "Transpose": lambda ins, at: np.transpose(ins[0], at["perm"]),
    "MatMul": lambda ins, at: np.matmul(ins[0], ins[1]),
    "Sub": lambda ins, at: ins[0] - ins[1],
    "Mul": lambda ins, at: ins[0] * ins[1],
    "Div": lambda ins, at: ins[0] / ins[1],
    "Sqrt": lambda ins, at: np.sqrt(ins[0]),
    "Erf": lambda ins, at: ERF(ins[0]).astype(np.float64),
    "Tanh": lambda ins, at: np.tanh(ins[0]),
    "ReduceMean": lambda ins, at: np.mean(ins[0], axis=tuple(at["axes"]),
                                          keepdims=bool(at.get("keepdims", 1))),
    "Softmax": lambda ins, at: softmax(ins[0], at.get("axis", -1)),
}


def widen(a):
    """Floats in float64; integers (token ids, shapes, indices) as they are."""
    return a.astype(np.float64) if a.dtype.kind == "f" else a


def run(model, x):
    values = {i.name: widen(numpy_helper.to_array(i)) for i in model.graph.initializer}
    values["input"] = widen(x)
    for node in model.graph.node:
        if node.op_type not in OPS:
            raise ValueError(f"operator {node.op_type} ({node.name}) is not one cohort emits")
        assert len(node.output) == 1, node  # BatchNormalization: Y only, at inference
        values[node.output[0]] = OPS[node.op_type]([values[i] for i in node.input], attrs(node))
    return values["logits"]


def check_interface(model, x):
    inp, out = model.graph.input, model.graph.output
    assert [i.name for i in inp] == ["input"] and [o.name for o in out] == ["logits"], (inp, out)
    dims = inp[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "N", "the batch dimension is symbolic"
    per_sample = [d.dim_value for d in dims[1:]]
    if len(per_sample) == 1:  # a flat model: (N, F)
        return x.reshape(x.shape[0], per_sample[0])
    assert per_sample == list(x.shape[1:]), (per_sample, x.shape)
    return x


def evaluate(path, x):
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == 13
    xin = check_interface(model, x)
    logits = np.concatenate([run(model, xin[i:i + 500]) for i in range(0, xin.shape[0], 500)])
    return logits, {p.key: p.value for p in model.metadata_props}


def main():
    return check_files(sys.argv[1], sys.argv[2], ".onnx", evaluate)


if __name__ == "__main__":
    sys.exit(main())
