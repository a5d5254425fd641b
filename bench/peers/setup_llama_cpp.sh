#!/usr/bin/env bash
# Fetches the llama.cpp source shipped inside the npm package node-llama-cpp and builds its CPU tools
# (llama-bench, llama-quantize, llama-completion) under build-peers/llama.cpp/build. Idempotent.
# LLAMA_ISA=avx2 builds a second copy under build-peers/llama.cpp/build-avx2 with what a Zen 3 has (AVX2, FMA,
# F16C, BMI2; no AVX-512), so that a machine with AVX-512 can also measure the peer the way it runs there.
# llama-completion is the classic text CLI; this llama.cpp builds llama-cli only together with the server and
# its web UI (LLAMA_BUILD_SERVER), which wants downloads this machine cannot make.
set -euo pipefail
repo_root="$(cd "$(dirname "$0")/../.." && pwd)"
peers_dir="${PEERS_DIR:-$repo_root/build-peers}"
version="${NODE_LLAMA_CPP_VERSION:-3.22.1}"
jobs="${JOBS:-2}"
isa="${LLAMA_ISA:-native}"
case "$isa" in
  native) build_dir=build isa_flags=(-DGGML_NATIVE=ON) ;;
  avx2)
    build_dir=build-avx2
    isa_flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
      -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF) ;;
  *) echo "setup_llama_cpp.sh: LLAMA_ISA must be native or avx2, not '$isa'" >&2; exit 2 ;;
esac
mkdir -p "$peers_dir"
cd "$peers_dir"

if [[ ! -f "node-llama-cpp-$version.tgz" ]]; then
  npm pack "node-llama-cpp@$version" >/dev/null
fi
if [[ ! -d llama.cpp ]]; then
  rm -rf nlc && mkdir nlc
  tar xzf "node-llama-cpp-$version.tgz" -C nlc
  git clone -q nlc/package/llama/gitRelease.bundle llama.cpp
fi

cd llama.cpp
if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
  cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release "${isa_flags[@]}" -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DBUILD_SHARED_LIBS=OFF
fi
nice -n 10 cmake --build "$build_dir" -j "$jobs" --target llama-bench llama-quantize llama-completion
ls -l "$build_dir"/bin/llama-bench "$build_dir"/bin/llama-quantize "$build_dir"/bin/llama-completion
