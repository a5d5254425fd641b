#!/usr/bin/env bash
# Runs npusim and the programs users would pick instead on this machine, in one go, at 1 and 2 threads, and
# prints one markdown table per model, ready for docs/benchmarks.md.
#
#   bench/peers/run_all.sh [--quick] [--rounds N] [--skip-resnet] [--skip-llm] [--isa avx2] [--llm-shape 1.5b|0.5b]
#
#   ResNet-18/50 and MobileNetV2 (seeded torchvision weights): npusim bench, ONNX Runtime (onnxruntime-node), PyTorch
#   1.13 eager; ResNet-50's start-up (npusim run's time to its first result, ONNX Runtime's session creation). The
#   ResNets run the torch_ir fixtures (tests/data/fixtures/ir/); other models the IR that
#   export_torchvision.py writes from a torch.fx trace.
#   Qwen2.5-1.5B-shaped LLM (random bf16 weights): npusim bench --model (bf16, and int8 weights quantized at load),
#   llama.cpp llama-bench (bf16, f16, Q8_0; Q8_0 is set against npusim's int8, the others against its bf16)
#
# --quick: fewer iterations, ResNet-18 only, prompt 32 / decode 8 instead of 128 / 32, one round.
# --rounds N: run every runner N times in turn (default 2). The tables set each runner's best round against the
# peer's, and give the median of the rounds' own ratios next to it: on a shared machine whose speed moves in spells
# of minutes, one runner's best round may fall in a quicker spell than the peer's; the runners of one round ran
# minutes apart at most.
# --isa avx2: what a machine without AVX-512 (the Zen 3 the targets name) runs, on this one: npusim with
# NPUSIM_CPU_ISA=avx2, PyTorch with ATEN_CPU_CAPABILITY=avx2, llama.cpp built for AVX2+FMA+F16C only
# (build-peers/llama.cpp/build-avx2). ONNX Runtime cannot be capped and picks its own kernels.
# --llm-shape: the LLM's shape, Qwen2.5-1.5B (default; tests/data/fixtures/qwen2.5-1.5b-instruct) or Qwen2.5-0.5B
# (bench/peers/qwen2.5-0.5b: hidden 896, a quarter of its weights in the tied embedding).
# Environment: NPUSIM (default build/bin/npusim), BENCH_LLM (default next to NPUSIM), PEERS_DIR (default
# build-peers), THREADS (default "1 2"). Everything downloaded, built or written goes under PEERS_DIR; missing
# pieces are set up on the first run (llama.cpp takes about 12 minutes to build on 2 cores).
set -euo pipefail

repo_root="$(cd "$(dirname "$0")/../.." && pwd)"
peers_script_dir="$repo_root/bench/peers"
export PEERS_DIR="${PEERS_DIR:-$repo_root/build-peers}"
npusim="${NPUSIM:-$repo_root/build/bin/npusim}"
bench_llm="${BENCH_LLM:-$(dirname "$npusim")/bench_llm}"
threads_list="${THREADS:-1 2}"
torch_python=/usr/bin/python3
export ORT_DISABLE_TELEMETRY=1

quick=0 run_resnet=1 run_llm=1 rounds="" isa=native llm_shape=1.5b
while (($#)); do
  arg="$1"
  shift
  case "$arg" in
    --quick) quick=1 ;;
    --rounds)
      rounds="${1:-}"
      shift || true
      [[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "run_all.sh: --rounds needs a positive integer" >&2; exit 2; } ;;
    --skip-resnet) run_resnet=0 ;;
    --skip-llm) run_llm=0 ;;
    --isa)
      isa="${1:-}"
      shift || true
      [[ "$isa" == avx2 ]] || { echo "run_all.sh: --isa takes avx2 (the default is this machine's own)" >&2; exit 2; } ;;
    --llm-shape)
      llm_shape="${1:-}"
      shift || true
      [[ "$llm_shape" == 1.5b || "$llm_shape" == 0.5b ]] || { echo "run_all.sh: --llm-shape takes 1.5b or 0.5b" >&2; exit 2; } ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_all.sh: unknown option '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

if ((quick)); then
  iters=5 warmup=1 resnet_models="resnet18" prompt=32 gen=8 llm_reps=1 rounds="${rounds:-1}"
else
  iters=20 warmup=3 resnet_models="resnet18 resnet50 mobilenet_v2" prompt=128 gen=32 llm_reps=2 rounds="${rounds:-2}"
fi
threads_csv="$(echo $threads_list | tr ' ' ',')"

llama_build=build
if [[ "$llm_shape" == 0.5b ]]; then
  llm=qwen05 llm_config="$peers_script_dir/qwen2.5-0.5b"
else
  llm=qwen15 llm_config="$repo_root/tests/data/fixtures/qwen2.5-1.5b-instruct"
fi
if [[ "$isa" == avx2 ]]; then
  export NPUSIM_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 LLAMA_ISA=avx2
  llama_build=build-avx2
fi

[[ -x "$npusim" ]] || { echo "run_all.sh: no npusim at $npusim (build it, or set NPUSIM)" >&2; exit 1; }
# Raised priority where allowed: the machine may be shared with builds.
run_nice=()
if nice -n -5 true 2>/dev/null; then run_nice=(nice -n -5); fi

results="$PEERS_DIR/results/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$results"
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, $(grep -o -w -E 'avx2|fma|f16c|avx512f|avx512_bf16|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')($(uname -r))"
  echo "load before: $(uptime | sed 's/.*load average: //')"
  echo "priority: ${run_nice[*]:-default}"
  echo "rounds: $rounds"
  [[ "$isa" == native ]] || echo "isa: $isa (npusim, llama.cpp, PyTorch; ONNX Runtime picks its own)"
  echo "probe: $("$npusim" probe --json)"
} > "$results/machine.txt"

# record FILE MODEL COMMAND...: runs COMMAND, keeps its JSON lines in FILE and (once) the command line for MODEL.
record() {
  local file="$1" model="$2"
  shift 2
  ((round > 1)) || printf '%s\t%s\n' "$model" "${*/#$repo_root\//}" >> "$results/commands.tsv"
  echo "+ $*" >&2
  "${run_nice[@]}" "$@" 2>> "$results/stderr.log" | tee -a "$results/stdout.log" | grep '^{' |
    sed "s/^{/{\"round\": $round, /" >> "$results/$file" || {
    echo "run_all.sh: failed: $* (see $results/stderr.log)" >&2
    return 1
  }
}

# startup MODEL THREADS: `npusim run --iters 1` processes, each one's start-up (process start to first result) as a
# JSON line in MODEL.startup.jsonl: first_ms, beyond_ms (of it, everything before the first result's run), prepare_ms
# (packing the weights, or mapping them from the pack cache), latency_ms and cache: "off" for five processes that
# pack the weights every run (--pack-cache off), then in a fresh pack cache "first" for the one that packs and keeps
# them and "mapped" for four that map what it kept.
startup() {
  local model="$1" t="$2" out cache_dir="$results/pack-cache-$model-$t-$round" cache
  ((round > 1)) || printf '%s\t%s\n' "$model" "npusim run $(graph_of "$model" | sed "s|^$repo_root/||") --weights ... --inputs ... --threads $t --iters 1 --pack-cache off|DIR (start-up, 5 + 5 processes)" >> "$results/commands.tsv"
  rm -rf "$cache_dir"
  for cache in off off off off off first mapped mapped mapped mapped; do
    out="$("${run_nice[@]}" "$npusim" run "$(graph_of "$model")" --weights "$PEERS_DIR/models/$model.safetensors" \
      --inputs "$PEERS_DIR/models/${model}_inputs.safetensors" --threads "$t" --iters 1 \
      --pack-cache "$([[ $cache == off ]] && echo off || echo "$cache_dir")" 2>> "$results/stderr.log")"
    echo "$out" | sed -n -E 's/^latency: min ([0-9.]+) ms.*/\1/p; s/^prepare: ([0-9.]+) ms.*/\1/p;
      s/^start-up: first result ([0-9.]+) ms after start, ([0-9.]+) ms beyond.*/\1 \2/p' | tr '\n' ' ' |
      awk -v t="$t" -v round="$round" -v cache="$cache" '{ printf "{\"round\": %d, \"threads\": %d, \"cache\": \"%s\", \"latency_ms\": %s, \"prepare_ms\": %s, \"first_ms\": %s, \"beyond_ms\": %s}\n",
        round, t, cache, $1, $2, $3, $4 }' >> "$results/$model.startup.jsonl"
  done
  rm -rf "$cache_dir"
}

ensure_ort() {
  [[ -d "$PEERS_DIR/ort/node_modules/onnxruntime-node" ]] && return
  mkdir -p "$PEERS_DIR/ort"
  [[ -f "$PEERS_DIR/ort/package.json" ]] || echo '{"name": "npusim-peers-ort", "private": true}' > "$PEERS_DIR/ort/package.json"
  (cd "$PEERS_DIR/ort" && npm install --ignore-scripts --no-audit --no-fund onnxruntime-node@1.30.0)
}

ensure_resnet() {
  [[ -f "$PEERS_DIR/models/$1.onnx" && -f "$PEERS_DIR/models/$1_ir.json" ]] && return
  "$torch_python" "$peers_script_dir/export_torchvision.py" --arch "$1" --out "$PEERS_DIR/models"
}

# The graph npusim runs for MODEL: torch_ir's fixture where there is one, else the exported IR.
graph_of() {
  local fixture="$repo_root/tests/data/fixtures/ir/$1_ir.json"
  if [[ -f "$fixture" ]]; then echo "$fixture"; else echo "$PEERS_DIR/models/$1_ir.json"; fi
}

ensure_llm() {
  local llama="$PEERS_DIR/llama.cpp/$llama_build/bin"
  [[ -x "$llama/llama-bench" && -x "$llama/llama-quantize" ]] || "$peers_script_dir/setup_llama_cpp.sh"
  if [[ ! -f "$PEERS_DIR/$llm/model.safetensors" ]]; then
    [[ -x "$bench_llm" ]] || { echo "run_all.sh: no bench_llm at $bench_llm (ninja -C build bench_llm)" >&2; exit 1; }
    "$bench_llm" write "$PEERS_DIR/$llm" --config "$llm_config"
  fi
  for type in bf16 f16; do
    [[ -f "$PEERS_DIR/$llm-$type.gguf" ]] ||
      PYTHONPATH="$PEERS_DIR/llama.cpp/gguf-py" "$torch_python" "$peers_script_dir/qwen_to_gguf.py" \
        "$PEERS_DIR/$llm" "$PEERS_DIR/$llm-$type.gguf" --type "$type"
  done
  [[ -f "$PEERS_DIR/$llm-q8_0.gguf" ]] ||
    "$llama/llama-quantize" "$PEERS_DIR/$llm-f16.gguf" "$PEERS_DIR/$llm-q8_0.gguf" Q8_0 > /dev/null
}

round=0
if ((run_resnet)); then
  ensure_ort
  for model in $resnet_models; do
    ensure_resnet "$model"
    # Same model everywhere: npusim's logits against PyTorch's before anything is timed.
    "$npusim" run "$(graph_of "$model")" --weights "$PEERS_DIR/models/$model.safetensors" \
      --inputs "$PEERS_DIR/models/${model}_inputs.safetensors" --outputs "$results/$model.npusim_logits.safetensors" > /dev/null
    "$npusim" verify "$results/$model.npusim_logits.safetensors" "$PEERS_DIR/models/${model}_logits.safetensors" |
      tail -n 1 > "$results/$model.verify.txt"
  done
fi
if ((run_llm)); then ensure_llm; fi

for ((round = 1; round <= rounds; ++round)); do
  if ((run_resnet)); then
    for model in $resnet_models; do
      weights="$PEERS_DIR/models/$model.safetensors" inputs="$PEERS_DIR/models/${model}_inputs.safetensors"
      for t in $threads_list; do
        record "$model.npusim.jsonl" "$model" "$npusim" bench "$(graph_of "$model")" \
          --weights "$weights" --inputs "$inputs" --threads "$t" --iters "$iters" --warmup "$warmup" --json
      done
      if [[ "$model" == resnet50 ]]; then
        for t in $threads_list; do startup "$model" "$t"; done
      fi
      record "$model.onnxruntime.jsonl" "$model" node "$peers_script_dir/bench_ort.mjs" "$PEERS_DIR/models/$model.onnx" \
        "$inputs" --threads "$threads_csv" --iters "$iters" --warmup "$warmup" \
        --reference "$PEERS_DIR/models/${model}_logits.safetensors"
      record "$model.pytorch.jsonl" "$model" "$torch_python" "$peers_script_dir/bench_torch.py" --arch "$model" \
        --weights "$weights" --inputs "$inputs" --threads "$threads_csv" --iters "$iters" --warmup "$warmup"
    done
  fi

  if ((run_llm)); then
    for t in $threads_list; do
      for quantize in none int8; do
        record "$llm.npusim.jsonl" "$llm" "$npusim" bench --model "$PEERS_DIR/$llm" --threads "$t" \
          --quantize "$quantize" --prompt-tokens "$prompt" --gen-tokens "$gen" --iters "$llm_reps" --json
      done
    done
    for type in bf16 f16 q8_0; do
      record "$llm.llama.cpp.jsonl" "$llm" "$PEERS_DIR/llama.cpp/$llama_build/bin/llama-bench" \
        -m "$PEERS_DIR/$llm-$type.gguf" -p "$prompt" -n "$gen" -t "$threads_csv" -r "$llm_reps" -o jsonl
    done
  fi
done

echo "load after: $(uptime | sed 's/.*load average: //')" >> "$results/machine.txt"
"$torch_python" "$peers_script_dir/format_results.py" "$results" | tee "$results/tables.md"
echo "results: $results" >&2
