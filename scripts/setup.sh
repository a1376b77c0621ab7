#!/usr/bin/env bash
# Installs cohort's dependencies from Debian 12 packages: the set a command needs, no more.
# Idempotent: installs only what is missing, runs `apt-get update` only when something is.
# Works as root on a fresh machine (or through sudo when not root).
set -euo pipefail

# Usage: scripts/setup.sh [runtime|test|bench]   (default: runtime)
#   runtime  what `scripts/train.sh` needs: the compiler, CMake, and the libraries the build finds
#            and the binary links (oneTBB, oneDNN, Open MPI, ...), pybind11 and Python's headers
#            (the Python package), and the Fashion-MNIST data set
#   test     runtime, plus what only the tests use: PyTorch and ONNX's checker (the export
#            checks), NumPy, clang and its sanitizer runtime (the TSan and fuzz presets),
#            matplotlib (bench/run_reduce_bench.py's plot, which a test draws, and
#            examples/python's), pytest (the Python package's tests)
#   bench    the same as test (bench/ scripts' peers and plots)
set_name=${1:-runtime}
case "$set_name" in
  runtime | test | bench) ;;
  *)
    echo "setup: expected runtime, test or bench, found '$set_name'" >&2
    exit 2
    ;;
esac

packages=(
  build-essential cmake ninja-build pkg-config
  libtbb-dev            # oneTBB 2021.8: the step's task graph
  libdnnl-dev           # oneDNN 2.6.3 (OpenMP runtime): the layers
  libopenblas-openmp-dev   # OpenBLAS 0.3.21 (OpenMP build): small f32 weight gradients
  ocl-icd-opencl-dev    # dnnl's CMake config asks for OpenCL
  libgtest-dev libbenchmark-dev   # found by the default configuration (tests and bench targets)
  zlib1g-dev            # .gz IDX files
  libpng-dev libturbojpeg0-dev   # image folders: PNG and JPEG files
  libcli11-dev nlohmann-json3-dev libtomlplusplus-dev libxxhash-dev
  libpcre2-dev          # GPT-2's pre-tokenizer (cohort sample --tokenizer)
  libonnx-dev libprotobuf-dev protobuf-compiler   # cohort export --format onnx (protobuf classes)
  openmpi-bin libopenmpi-dev   # multi-rank runs: mpirun -np R cohort train (src/dist)
  dataset-fashion-mnist # the real Fashion-MNIST under /usr/share/datasets/fashion-mnist
  pybind11-dev python3-dev python3-numpy   # the Python package `cohort` (python/)
)
if [[ "$set_name" != runtime ]]; then
  packages+=(
    clang libclang-rt-14-dev   # the ThreadSanitizer build of the reducer core, the fuzzers
    python3-torch libopenblas0-openmp  # tests/export and bench/peers: PyTorch (with a fast BLAS)
    python3-onnx          # tests/export: onnx.checker on exported ONNX files
    python3-numpy         # scripts/convert_dataset.py, the --data format test, tests/export
    python3-pytest        # tests/python: the Python package's tests
    python3-matplotlib    # bench/ scripts' plots (the reduction benchmark's, tested)
  )
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages of the $set_name set present"
  exit 0
fi
sudo_cmd=()
if [[ $(id -u) != 0 ]]; then sudo_cmd=(sudo); fi
echo "setup: installing ${missing[*]}"
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
