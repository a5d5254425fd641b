#!/usr/bin/env bash
# The whole test suite on the CPU (GPU tests carry the label `gpu` and are left out), then the unit tests again
# under AddressSanitizer + UndefinedBehaviorSanitizer with the leak checker (scripts/sanitize.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
ctest --test-dir build -j"$(nproc)" --output-on-failure -LE gpu
bash scripts/sanitize.sh
