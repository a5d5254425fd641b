#!/usr/bin/env bash
# The whole test suite on the CPU (GPU tests carry the label `gpu` and are left out).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
ctest --test-dir build -j"$(nproc)" --output-on-failure -LE gpu
