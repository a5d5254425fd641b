#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang-14, ASan and UBSan into build-fuzz/ and runs each, one after
# the other, for SECONDS seconds (default 60) on its seed corpus from tests/data/fixtures.
#   usage: scripts/fuzz.sh [SECONDS] [TARGET...]
#   (targets: torch_ir safetensors npy model_config npubin tokenizer model_dir; default all)
# The corpus each run grows is kept in build-fuzz/corpus/TARGET; a crashing input lands in
# build-fuzz/artifacts/TARGET/ and makes the script fail. Reproduce one with: build-fuzz/bin/fuzz_TARGET FILE
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
[[ $seconds =~ ^[0-9]+$ ]] || { echo "usage: scripts/fuzz.sh [SECONDS] [TARGET...]" >&2; exit 2; }

packages=(clang-14 libclang-rt-14-dev flatbuffers-compiler libflatbuffers-dev libxxhash-dev)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

build=build-fuzz
jobs=${NPUSIM_FUZZ_JOBS:-$(nproc)}
CC=clang-14 CXX=clang++-14 cmake -S fuzz -B "$build" -G Ninja >/dev/null
ninja -C "$build" -j"$jobs"

seeds=$build/seeds
rm -rf "$seeds"
python3 fuzz/make_seeds.py tests/data/fixtures "$seeds" src/ops
if [[ -x $build/bin/make_npubin_seeds ]]; then
  ASAN_OPTIONS=detect_leaks=0 "$build/bin/make_npubin_seeds" "$seeds/npubin" "$seeds"/torch_ir/*.json \
    tests/data/fixtures/ir/resnet18_ir.json tests/data/fixtures/qwen_tiny/decode_ir.json 2>/dev/null ||
    echo "note: no .npubin seeds (make_npubin_seeds failed); fuzz_npubin starts from its corpus alone"
fi

targets=("$@")
if ((${#targets[@]} == 0)); then
  for binary in "$build"/bin/fuzz_*; do targets+=("$(basename "$binary" | sed 's/^fuzz_//')"); done
fi

declare -A extra_flags=(
  [torch_ir]="-max_len=16384 -dict=$seeds/torch_ir.dict"
  [model_config]="-max_len=4096"
  [npubin]="-max_len=65536"
  [tokenizer]="-max_len=16384"
  [model_dir]="-max_len=8192"
)

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
failed=0
summary=()
for target in "${targets[@]}"; do
  binary=$build/bin/fuzz_$target
  [[ -x $binary ]] || { echo "no fuzz target '$target' (built: $(ls "$build"/bin | grep '^fuzz_' | tr '\n' ' '))" >&2; exit 2; }
  corpus=$build/corpus/$target
  artifacts=$build/artifacts/$target
  log=$build/logs/$target.log
  mkdir -p "$corpus" "$artifacts" "$seeds/$target" "$(dirname "$log")"
  echo "== fuzz_$target for ${seconds}s (log: $log)"
  status=0
  started=$SECONDS
  # shellcheck disable=SC2086  # extra flags are several words
  "$binary" "$corpus" "$seeds/$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$artifacts/" -print_final_stats=1 ${extra_flags[$target]:-} >"$log" 2>&1 || status=$?
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | awk '{print $2}' | tail -1)
  coverage=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | awk '{print $2}')
  found=$(find "$artifacts" -type f | wc -l)
  line="fuzz_$target: $((SECONDS - started))s, ${execs:-?} execs, coverage ${coverage:-?} edges, corpus $(ls "$corpus" | wc -l) files, exit $status, $found artifact(s)"
  echo "$line"
  summary+=("$line")
  if ((status != 0)); then
    failed=1
    grep -E 'ERROR|SUMMARY|runtime error|Test unit written' "$log" | head -5 || true
  fi
done

echo "== summary"
printf '%s\n' "${summary[@]}"
exit $failed
