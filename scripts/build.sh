#!/usr/bin/env bash
# Configures and builds npusim into build/ (the CLI lands at build/bin/npusim).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
