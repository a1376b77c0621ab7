#!/usr/bin/python3
"""A language model's exports in PyTorch and ONNX (ctest export_gpt_in_pytorch): cohort trains
gpt:2-2-32-16 (nanoGPT's architecture) and gpt:2-2-32-16,bias,gelu=tanh,pad=64 (GPT-2's: biases,
the tanh GELU, the vocabulary padded) for 30 steps each on the first 20,000 characters of Tiny
Shakespeare and exports them.
- safetensors: bench/peers/torch_gpt_peer.py's GPT (nanoGPT's module tree) loads the file with
  strict=True — both transformer.wte.weight and the tied lm_head.weight present — and computes
  `cohort eval`'s validation loss (the whole split in non-overlapping windows) within 1e-4.
- Both record the vocabulary: vocab and characters (token i is character i) in their metadata.
- ONNX: onnx.checker's full check; input "input" (N, T) int64 and output "logits" (N, T, vocab)
  with symbolic N and T; check_onnx.py's NumPy evaluator gives cohort eval's validation loss
  within 1e-4 and its next-token accuracy exactly, and PyTorch's logits within 1e-4 on the
  validation windows and on windows of 5 tokens and of 1 (T below the block).
- GPT-2's architecture also as Hugging Face's folder (export --layout hf): config.json says
  "gelu_new" and bias true, and from_hugging_face's renaming and transposition load the weights
  into the same PyTorch model (strict), giving the same loss within 1e-4.

  tests/export/check_gpt.py COHORT TEXT OUT_DIR
Exit 77 (1 under COHORT_REQUIRE_FRAMEWORKS=1) without torch, onnx or numpy.
"""
import json
import os
import subprocess
import sys

from export_check_util import SKIP

try:
    import numpy as np
    import onnx
    import torch
except ImportError as e:
    print(f"SKIP: {e} (scripts/setup.sh installs python3-torch, python3-onnx and python3-numpy)")
    sys.exit(SKIP)

import check_onnx  # noqa: E402
from check_safetensors import read_safetensors  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench",
                                "peers"))
import torch_gpt_peer  # noqa: E402

LAYERS, HEADS, EMBD, BLOCK = 2, 2, 32, 16


def run(*cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def check_vocabulary(metadata, chars):
    """The export's metadata maps token i to character i of the text's sorted characters."""
    assert metadata["vocab"] == str(len(chars)), metadata["vocab"]
    assert metadata["characters"] == "".join(chars), metadata["characters"]


def check_onnx_file(spec, path, model, val, chars, want_loss, want_accuracy):
    """The ONNX file against cohort eval (loss, accuracy) and the PyTorch model (logits)."""
    proto = onnx.load(path)
    onnx.checker.check_model(proto, full_check=True)
    assert proto.opset_import[0].version == 13
    check_vocabulary({p.key: p.value for p in proto.metadata_props}, chars)
    io = [(v.name, v.type.tensor_type.elem_type,
           [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim])
          for v in list(proto.graph.input) + list(proto.graph.output)]
    vocab = model.lm_head.weight.shape[0]
    assert io == [("input", onnx.TensorProto.INT64, ["N", "T"]),
                  ("logits", onnx.TensorProto.FLOAT, ["N", "T", vocab])], io
    count = (len(val) - 1) // BLOCK
    x = torch.stack([val[o * BLOCK:o * BLOCK + BLOCK] for o in range(count)])
    y = torch.stack([val[o * BLOCK + 1:o * BLOCK + BLOCK + 1] for o in range(count)]).numpy()
    logits = check_onnx.run(proto, x.numpy())
    z = logits - logits.max(axis=-1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    loss = float(-np.take_along_axis(log_p, y[..., None], axis=-1).mean())
    accuracy = float((logits.argmax(axis=-1) == y).mean())
    print(f"{spec}: ONNX validation loss {loss:.6f} and accuracy {accuracy:.6f}, cohort eval "
          f"{want_loss:.6f} and {want_accuracy:.6f}")
    ok = abs(loss - want_loss) <= 1e-4 and accuracy == want_accuracy
    with torch.no_grad():
        for t in (BLOCK, 5, 1):
            diff = float(np.abs(check_onnx.run(proto, x[:, :t].numpy()) -
                                model.logits(x[:, :t]).numpy()).max())
            print(f"{spec}: windows of {t}: max |ONNX - PyTorch logit| {diff:.3g}")
            ok = ok and diff <= 1e-4
    return ok


def check(cohort, folder, out, spec, bias, gelu):
    """Trains `spec`, exports it, and checks each export against cohort eval; the failure or
    None."""
    name = spec.replace(":", "_").replace(",", "_").replace("=", "_")
    ckpt, st, onnx_file, summary, hf = (os.path.join(out, name + n) for n in (
        ".ckpt", ".safetensors", ".onnx", ".eval.json", ".hf"))
    run(cohort, "train", "--data", folder, "--model", spec, "--batch", "8", "--steps", "30",
        "--optimizer", "adamw", "--lr", "0.003", "--warmup-steps", "0", "--quiet", "--save", ckpt)
    run(cohort, "export", "--checkpoint", ckpt, "--format", "safetensors", "-o", st)
    run(cohort, "export", "--checkpoint", ckpt, "--format", "onnx", "-o", onnx_file)
    run(cohort, "eval", "--checkpoint", ckpt, "--data", folder, "--quiet", "--summary", summary)
    with open(summary) as f:
        result = json.load(f)
    want = result["test_loss"]
    tensors, metadata = read_safetensors(st)
    assert metadata["model"] == spec and metadata["naming"] == "peer", metadata
    assert "lm_head.weight" in tensors and "transformer.wte.weight" in tensors, sorted(tensors)
    assert torch.equal(tensors["lm_head.weight"], tensors["transformer.wte.weight"])
    _, val, chars = torch_gpt_peer.load_text(os.path.join(folder, "input.txt"))
    check_vocabulary(metadata, chars)
    model = torch_gpt_peer.GPT(len(chars), BLOCK, LAYERS, HEADS, EMBD, bias=bias, gelu=gelu)
    model.load_state_dict(tensors, strict=True)
    got = torch_gpt_peer.validation_loss(model, val, BLOCK)
    print(f"{spec}: PyTorch validation loss {got:.6f}, cohort eval {want:.6f}")
    if abs(got - want) > 1e-4:
        return (f"{spec}: PyTorch's validation loss {got} differs from cohort's {want} by more "
                "than 1e-4")
    if not check_onnx_file(spec, onnx_file, model, val, chars, want, result["test_accuracy"]):
        return f"{spec}: the ONNX export differs from cohort eval or PyTorch"
    if not bias:
        return None
    run(cohort, "export", "--checkpoint", ckpt, "--format", "safetensors", "--layout", "hf", "-o",
        hf)
    with open(os.path.join(hf, "config.json")) as f:
        config = json.load(f)
    assert config["activation_function"] == "gelu_new" and config["bias"] is True, config
    assert config["vocab_size"] == len(chars), config
    hf_tensors, _ = read_safetensors(os.path.join(hf, "model.safetensors"))
    model = torch_gpt_peer.GPT(len(chars), BLOCK, LAYERS, HEADS, EMBD, bias=bias, gelu=gelu)
    model.load_state_dict(torch_gpt_peer.from_hugging_face(hf_tensors), strict=True)
    got = torch_gpt_peer.validation_loss(model, val, BLOCK)
    print(f"{spec}: Hugging Face's layout in PyTorch: validation loss {got:.6f}")
    if abs(got - want) > 1e-4:
        return f"{spec}: the Hugging Face folder's loss {got} differs from cohort's {want}"
    return None


def main():
    cohort, text, out = sys.argv[1:4]
    folder = os.path.join(out, "text")
    os.makedirs(folder, exist_ok=True)
    with open(text, encoding="utf-8") as f:
        head = f.read(20000)
    with open(os.path.join(folder, "input.txt"), "w", encoding="utf-8") as f:
        f.write(head)
    failures = [f for f in (check(cohort, folder, out, "gpt:2-2-32-16", False, "erf"),
                            check(cohort, folder, out, "gpt:2-2-32-16,bias,gelu=tanh,pad=64",
                                  True, "tanh")) if f]
    if failures:
        sys.exit("\n".join(failures))


if __name__ == "__main__":
    main()
