#!/usr/bin/env bash
# Builds the tests with AddressSanitizer + UndefinedBehaviorSanitizer (-DNPUSIM_SANITIZE=ON: any report aborts
# the test) into build-asan/ and runs the unit tests with the leak checker on.
#   usage: scripts/sanitize.sh [--all]    (--all: the whole CPU suite, e2e included, instead of the unit tests)
set -euo pipefail
cd "$(dirname "$0")/.."

scope=unit
case "${1:-}" in
  "") ;;
  --all) scope=all ;;
  *) echo "usage: scripts/sanitize.sh [--all]" >&2; exit 2 ;;
esac

bash scripts/setup.sh
build=build-asan
jobs=${NPUSIM_SANITIZE_JOBS:-$(nproc)}
# -O1 keeps stack traces exact and compiles faster than -O2; line tables (-g1) are all a report needs.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DNPUSIM_SANITIZE=ON >/dev/null

export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
if [[ $scope == unit ]]; then
  targets=(npusim)
  for source in tests/unit/test_*.cpp; do targets+=("$(basename "$source" .cpp)"); done
  ninja -C "$build" -j"$jobs" "${targets[@]}"
  ctest --test-dir "$build" -j"$jobs" --output-on-failure -L unit
else
  ninja -C "$build" -j"$jobs"
  ctest --test-dir "$build" -j"$jobs" --output-on-failure -LE gpu
fi
