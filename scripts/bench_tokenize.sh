#!/usr/bin/env bash
# Benchmarks `trident tokenize` on the King James Bible, GPT-2's BPE: the same 1167 chapters
# (Genesis to Jude, 4.1 MB of text) COPIES times over (default 8: 33 MB, so that the start-up
# weighs little) as JSON lines (scripts/kjv_jsonl.py: plain, .zst and .gz)
# and as a text file of the chapters split on blank lines (the text path), each run on one core
# (taskset -c 0, --threads 1: the reader and the encoder share it), best of REPEATS. Prints, per
# path, the MB per second of CPU time (user + system: what a core gives, whatever else the
# machine runs) over the input's bytes (the JSON lines, uncompressed), for the whole run and
# with the start-up left out (loading GPT-2's files, measured as the same command on a
# one-document input: a corpus of gigabytes pays it once), and the wall time; and checks that
# every path wrote the same ids.
# Usage: scripts/bench_tokenize.sh [BUILD_DIR] [REPEATS] [COPIES]   (default build/, 5, 8)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
repeats=${2:-5}
copies=${3:-8}
trident=$build/trident
[[ -x "$trident" ]] || { echo "bench_tokenize: $trident is missing; build first" >&2; exit 1; }
pin=()
command -v taskset >/dev/null && pin=(taskset -c 0)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$root/scripts/kjv_jsonl.py" "$tmp/plain" --train-files 1 --copies "$copies" --text >/dev/null
for compress in zst gz; do
  "$root/scripts/kjv_jsonl.py" "$tmp/$compress" --train-files 1 --copies "$copies" \
    --compress "$compress" >/dev/null
done
json_bytes=$(stat -c %s "$tmp/plain/train_000.jsonl")
text_bytes=$(stat -c %s "$tmp/plain/train.txt")

# Runs one path REPEATS times; prints the best CPU and wall seconds.
best() {
  local name=$1 cpu wall u s best_cpu=1e9 best_wall=1e9
  shift
  TIMEFORMAT='%3R %3U %3S'
  for ((i = 0; i < repeats; i++)); do
    read -r wall u s < <({ time "${pin[@]}" "$trident" tokenize --no-progress --threads 1 \
                             --output "$tmp/$name.bin" "$@" >/dev/null; } 2>&1)
    cpu=$(awk -v u="$u" -v s="$s" 'BEGIN { print u + s }')
    best_cpu=$(awk -v a="$cpu" -v b="$best_cpu" 'BEGIN { print (a < b) ? a : b }')
    best_wall=$(awk -v a="$wall" -v b="$best_wall" 'BEGIN { print (a < b) ? a : b }')
  done
  echo "$best_cpu $best_wall"
}

report() {
  local name=$1 bytes=$2 cpu wall start_cpu start_wall
  read -r cpu wall <<<"$3"
  read -r start_cpu start_wall <<<"$startup"
  awk -v n="$name" -v b="$bytes" -v c="$cpu" -v w="$wall" -v s="$start_cpu" 'BEGIN {
    printf "%-18s cpu %.3f s, wall %.3f s | %.1f MB/s per core, %.1f without the start-up | %.1f MB/s wall\n",
           n, c, w, b / 1e6 / c, b / 1e6 / (c - s), b / 1e6 / w }'
}

echo '{"text": "In the beginning"}' >"$tmp/one.jsonl"
startup=$(best one "$tmp/one.jsonl")
text=$(best text --split-on '\n\n' "$tmp/plain/train.txt")
jsonl=$(best jsonl "$tmp/plain/train_000.jsonl")
zst=$(best zst "$tmp/zst/train_000.jsonl.zst")
gz=$(best gz "$tmp/gz/train_000.jsonl.gz")
echo "the KJV, Genesis to Jude, $copies times: $text_bytes bytes of text, $json_bytes of JSON lines; one core, best of $repeats"
echo "start-up (one document): cpu $(cut -d' ' -f1 <<<"$startup") s"
report "text (--split-on)" "$text_bytes" "$text"
report "JSON lines" "$json_bytes" "$jsonl"
report "JSON lines, zstd" "$json_bytes" "$zst"
report "JSON lines, gzip" "$json_bytes" "$gz"
for f in jsonl zst gz; do
  cmp -s "$tmp/text.bin" "$tmp/$f.bin" || { echo "bench_tokenize: $f.bin differs from text.bin" >&2; exit 1; }
done
echo "every path wrote the same ids"
