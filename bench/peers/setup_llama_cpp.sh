#!/usr/bin/env bash
# Fetches the llama.cpp source shipped inside the npm package node-llama-cpp and builds its CPU tools
# (llama-bench, llama-quantize, llama-completion) under build-peers/llama.cpp/build. Idempotent.
# llama-completion is the classic text CLI; this llama.cpp builds llama-cli only together with the server and
# its web UI (LLAMA_BUILD_SERVER), which wants downloads this machine cannot make.
set -euo pipefail
repo_root="$(cd "$(dirname "$0")/../.." && pwd)"
peers_dir="${PEERS_DIR:-$repo_root/build-peers}"
version="${NODE_LLAMA_CPP_VERSION:-3.22.1}"
jobs="${JOBS:-2}"
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
if [[ ! -f build/CMakeCache.txt ]]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DBUILD_SHARED_LIBS=OFF
fi
nice -n 10 cmake --build build -j "$jobs" --target llama-bench llama-quantize llama-completion
ls -l build/bin/llama-bench build/bin/llama-quantize build/bin/llama-completion
