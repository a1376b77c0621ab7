#!/usr/bin/env bash
# The whole test suite, on a fresh Debian 12 machine: installs what is missing, builds the
# release preset (unity builds, below) and runs every test, installs it and builds and runs
# examples/embed against the installed package and examples/python with the installed Python
# package, builds the ThreadSanitizer preset (clang) of the
# dependency-free core (the reducers) and runs its tests, then runs every test again under
# AddressSanitizer + UndefinedBehaviorSanitizer, and fuzzes the IDX, NumPy, CSV, image, text,
# checkpoint and job-config readers and the `cohort train` command line (as a dry run) for a
# bounded time (COHORT_FUZZ_SECONDS each, default 20; one fuzzer per core at a time) after
# replaying their corpora.
# Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
jobs=$(nproc)
# Unity builds: CMake compiles each target's sources a few files at a time, as one file, which
# halves the compile time of these one-off builds (docs/decisions.md). The setting stays in the
# build folders this script configures: -DCMAKE_UNITY_BUILD=OFF there for file-by-file rebuilds.
unity=-DCMAKE_UNITY_BUILD=${COHORT_UNITY_BUILD:-ON}

echo "== release build and tests"
cmake --preset release "$unity"
cmake --build --preset release -j "$jobs"
COHORT_REQUIRE_FRAMEWORKS=1 ctest --preset release -j "$jobs"  # the export checks may not skip

# The installed package works from another CMake project: examples/embed, configured against
# build/install only, trains a few steps and saves a checkpoint that the installed cohort reads.
echo "== install, and a program built against the installed package (examples/embed)"
rm -rf build/install build/embed
cmake --install build/release --prefix build/install
cmake -S examples/embed -B build/embed -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$PWD/build/install"
cmake --build build/embed -j "$jobs"
build/embed/embed datasets/fixture build/embed/embed.ckpt 5
build/install/bin/cohort eval --checkpoint build/embed/embed.ckpt --data datasets/fixture
test -s build/embed/embed.ckpt.safetensors  # the example's export

# The Python package from the install tree alone: examples/python trains, plots and reads weights.
echo "== the Python package from the install tree (examples/python)"
py_version=$(/usr/bin/python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
export_path="$PWD/build/install/lib/python$py_version/dist-packages"
PYTHONPATH="$export_path" /usr/bin/python3 -c \
  "import cohort, sys; assert cohort.__file__.startswith(sys.argv[1]), cohort.__file__" "$export_path"
PYTHONPATH="$export_path" /usr/bin/python3 examples/python/train_and_plot.py \
  --data datasets/fixture --steps 20 --out build/install/python_example/loss.png
test -s build/install/python_example/loss.png

echo "== ThreadSanitizer build of the reducer core and its tests"
cmake --preset tsan "$unity"
cmake --build --preset tsan -j "$jobs"
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ctest --preset tsan -j "$jobs"

echo "== AddressSanitizer + UndefinedBehaviorSanitizer build and tests"
cmake --preset asan "$unity"
cmake --build --preset asan -j "$jobs"
ASAN_OPTIONS="detect_leaks=1" ctest --preset asan -j "$jobs"

echo "== libFuzzer: replay the corpora, then fuzz each target for a bounded time"
cmake --preset fuzz "$unity"
fuzzers=(idx npy csv image text checkpoint config cli)
cmake --build --preset fuzz -j "$jobs" --target "${fuzzers[@]/#/fuzz_}"
ctest --preset fuzz
seconds=${COHORT_FUZZ_SECONDS:-20}
# One fuzzer per core at a time; each writes its log beside its build and prints its summary lines.
fuzz() {
  local target=$1 work
  work=$(mktemp -d)
  cp tests/fuzz/corpus/$target/* "$work"/
  build/fuzz/tests/fuzz/fuzz_$target -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix=build/fuzz/crash-$target- -print_final_stats=1 "$work" \
    > build/fuzz/fuzz-$target.log 2>&1 || true
  rm -rf "$work"
}
running=0
for target in "${fuzzers[@]}"; do
  if ((running == jobs)); then
    wait -n
    running=$((running - 1))
  fi
  fuzz $target &
  running=$((running + 1))
done
wait
for target in "${fuzzers[@]}"; do
  echo "fuzz_$target:"
  grep -E "stat::number_of_executed_units|Done|ERROR|crash" build/fuzz/fuzz-$target.log || true
  if ls build/fuzz/crash-$target-* > /dev/null 2>&1; then
    echo "fuzz_$target found a crash: build/fuzz/crash-$target-* (add it to tests/fuzz/crashes/$target/)"
    exit 1
  fi
  if ! grep -q "^Done" build/fuzz/fuzz-$target.log 2> /dev/null; then
    echo "fuzz_$target did not finish its run: build/fuzz/fuzz-$target.log"
    exit 1
  fi
done
