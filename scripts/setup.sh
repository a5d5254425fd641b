#!/usr/bin/env bash
# Installs the Debian packages npusim needs to build and test (run as root on Debian 12).
set -euo pipefail
packages=(build-essential cmake ninja-build nlohmann-json3-dev libgtest-dev python3 python3-numpy python3-torch
  python3-torchvision python3-jinja2 flatbuffers-compiler libflatbuffers-dev libxxhash-dev)
# Node.js runs the reference tokenizer of the tokenizer tests; a Node.js installed another way (it brings npm) is kept.
command -v npm >/dev/null || packages+=(nodejs npm)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
