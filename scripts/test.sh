#!/usr/bin/env bash
# The whole test suite, on a fresh Debian 12 machine: installs what is missing, builds the
# release preset and runs every test, builds the ThreadSanitizer preset (clang) of the
# dependency-free core (the reducers) and runs its tests, then runs every test again under
# AddressSanitizer + UndefinedBehaviorSanitizer. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=$(nproc)

echo "== release build and tests"
cmake --preset release
cmake --build --preset release -j "$jobs"
ctest --preset release -j "$jobs"

echo "== ThreadSanitizer build of the reducer core and its tests"
cmake --preset tsan
cmake --build --preset tsan -j "$jobs"
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ctest --preset tsan -j "$jobs"

echo "== AddressSanitizer + UndefinedBehaviorSanitizer build and tests"
cmake --preset asan
cmake --build --preset asan -j "$jobs"
ASAN_OPTIONS="detect_leaks=1" ctest --preset asan -j "$jobs"
