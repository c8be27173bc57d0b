#!/usr/bin/env bash
# Benchmarks the GPT-2 tokenizer on the King James Bible (Debian's bible-kjv, 4.4 MB): Trident's
# encode() (trident_tokenize_ids --bench, best of 3) against the JavaScript encoder that the
# tests compare with (gpt-3-encoder's Encoder.js in node, tests/tools/gpt2_encode.js), both
# pinned to one core, and prints MB/s for each and the ratio.
# Usage: scripts/bench_tokenizer.sh [BUILD_DIR]   (default build/; needs a build with tests)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
dir=${TRIDENT_TOKENIZER_DIR:-$root/data/gpt2}
tool=$build/tests/trident_tokenize_ids
[[ -x "$tool" ]] || { echo "bench_tokenizer: $tool is missing; build with tests first" >&2; exit 1; }
[[ -f "$dir/Encoder.js" ]] || "$root/scripts/fetch_gpt2_tokenizer.sh" "$dir"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bible -f "Genesis 1:1-Revelation 22:21" > "$tmp/kjv.txt"
# One core for each, so the figures are per core (node's collector threads included).
pin=()
command -v taskset >/dev/null && pin=(taskset -c 0)

ours=$("${pin[@]}" "$tool" --dir "$dir" --bench --repeat 1 "$tmp/kjv.txt")
js=$("${pin[@]}" node "$root/tests/tools/gpt2_encode.js" "$dir" --bench "$tmp/kjv.txt")
rate() { grep -o '"mb_per_s": *[0-9.]*' <<<"$1" | grep -o '[0-9.]*$'; }
echo "trident: $ours"
echo "js:      $js"
awk -v a="$(rate "$ours")" -v b="$(rate "$js")" \
  'BEGIN { printf "GPT-2 encode, KJV, one core: trident %.1f MB/s, JavaScript %.2f MB/s, %.1fx\n", a, b, a / b }'
