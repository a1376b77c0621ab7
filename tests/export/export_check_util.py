"""Shared by check_safetensors.py and check_onnx.py: the fixture's test set read by hand (IDX,
gzip), and cohort's own results for one exported model (`cohort eval --logits` and --summary).
Not a test by itself."""
import glob
import gzip
import json
import os

try:
    import numpy as np
except ImportError:  # the checks exit SKIP themselves before using it
    np = None

# ctest SKIP_RETURN_CODE: a framework this check needs is not installed. scripts/test.sh sets
# COHORT_REQUIRE_FRAMEWORKS=1 (setup.sh installs them), so in CI a missing one fails instead.
SKIP = 1 if os.environ.get("COHORT_REQUIRE_FRAMEWORKS") == "1" else 77


def load_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def test_set(data_dir):
    """(N, 1, 28, 28) float32 pixels / 255 and (N,) int64 labels, as the PyTorch peer reads them."""
    x = load_idx(os.path.join(data_dir, "t10k-images-idx3-ubyte.gz")).astype(np.float32) / 255.0
    y = load_idx(os.path.join(data_dir, "t10k-labels-idx1-ubyte.gz")).astype(np.int64)
    return x.reshape(x.shape[0], 1, x.shape[1], x.shape[2]), y


def cohort_results(base):
    """cohort's logits (N, classes) and test accuracy for OUT/<name>."""
    with open(base + ".json") as f:
        summary = json.load(f)
    return np.load(base + ".npy"), summary["test_accuracy"]


def compare(name, logits, cohort_logits, labels, cohort_accuracy, tolerance=1e-4):
    """Prints one line; returns False on a mismatch."""
    assert logits.shape == cohort_logits.shape, (logits.shape, cohort_logits.shape)
    diff = float(np.max(np.abs(logits - cohort_logits)))
    correct = int(np.sum(np.argmax(logits, axis=1) == labels))
    accuracy = correct / labels.shape[0]
    ok = diff <= tolerance and accuracy == cohort_accuracy
    print(f"{name}: max |logit difference| {diff:.3g} (tolerance {tolerance}), accuracy "
          f"{accuracy:.4f} ({correct}/{labels.shape[0]}) against cohort eval's "
          f"{cohort_accuracy:.4f}: {'ok' if ok else 'MISMATCH'}")
    return ok


def check_files(out_dir, data_dir, ext, evaluate):
    """Runs evaluate(path, x) -> (logits, metadata) on every OUT/*<ext> and compares each with
    cohort's results; returns the exit code (1 on a mismatch or when there is no file)."""
    x, y = test_set(data_dir)
    files = sorted(glob.glob(os.path.join(out_dir, "*" + ext)))
    if not files:
        print(f"no {ext} files in {out_dir}")
        return 1
    ok = True
    for path in files:
        logits, meta = evaluate(path, x)
        cohort_logits, cohort_accuracy = cohort_results(path[: -len(ext)])
        name = f"{os.path.basename(path)} ({meta['model']}, step {meta['step']})"
        ok = compare(name, logits, cohort_logits, y, cohort_accuracy) and ok
    print(f"{len(files)} checked" if ok else "FAILED")
    return 0 if ok else 1
