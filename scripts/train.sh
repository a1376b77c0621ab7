#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install what is missing, build, and train the default
# model on Fashion-MNIST with every core. Extra arguments go to `cohort train`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh runtime
cmake --preset release > /dev/null
cmake --build --preset release -j "$(nproc)" --target cohort
mkdir -p runs
exec build/release/cohort train --summary runs/summary.json --metrics runs/metrics.jsonl "$@"
