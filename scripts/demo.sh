#!/usr/bin/env bash
# The main job: ResNet-18 from its exported graph, seeded random weights, a synthetic image, on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
./build/bin/npusim run tests/data/fixtures/ir/resnet18_ir.json --random-weights 0 --random-inputs 0 --top 5 --iters 3
