#!/usr/bin/env bash
# Installs cohort's build and run dependencies from Debian 12 packages.
# Idempotent: installs only what is missing, runs `apt-get update` only when something is.
# Works as root on a fresh machine (or through sudo when not root).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libtbb-dev            # oneTBB 2021.8: the step's task graph
  libdnnl-dev           # oneDNN 2.6.3 (OpenMP runtime): the layers
  ocl-icd-opencl-dev    # dnnl's CMake config asks for OpenCL
  libgtest-dev libbenchmark-dev
  zlib1g-dev            # .gz IDX files
  libcli11-dev nlohmann-json3-dev libtomlplusplus-dev libxxhash-dev
  clang libclang-rt-14-dev   # the ThreadSanitizer build of the reducer core
  dataset-fashion-mnist # the real Fashion-MNIST under /usr/share/datasets/fashion-mnist
  libonnx-dev libprotobuf-dev protobuf-compiler   # cohort export --format onnx (protobuf classes)
  python3-torch libopenblas0-openmp  # tests/export: exports loaded in PyTorch
  python3-onnx          # tests/export: onnx.checker on exported ONNX files
  openmpi-bin libopenmpi-dev   # multi-rank runs: mpirun -np R cohort train (src/dist)
  python3-numpy         # scripts/convert_dataset.py, the --data format test, tests/export
)
if [[ "${COHORT_SETUP_PLOTS:-0}" == 1 ]]; then packages+=(python3-matplotlib); fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi
sudo_cmd=()
if [[ $(id -u) != 0 ]]; then sudo_cmd=(sudo); fi
echo "setup: installing ${missing[*]}"
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
