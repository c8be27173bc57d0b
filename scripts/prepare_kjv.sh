#!/usr/bin/env bash
# Prepares the default corpus: the King James Bible from Debian's bible-kjv, tokenized with
# GPT-2's BPE into llm.c shards. Genesis to Jude is the training set, Revelation the
# validation set. The fine-tuning example (configs/kjv-lora.yaml) adapts the trained model to
# Revelation, which it never trained on: chapters 1-19 to train (revelation_train.bin), 20-22
# to validate (revelation_valid.bin). Usage: scripts/prepare_kjv.sh [OUT_DIR] (default data/kjv/gpt2).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/data/kjv/gpt2}
trident=${TRIDENT:-$root/build/trident}
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Each verse comes as "Ge1:1 In the beginning..."; the reference is dropped.
bible -f "Genesis 1:1-Jude 1:25" | sed -E 's/^[^ ]+ //' > "$tmp/train.txt"
bible -f "Revelation 1:1-Revelation 22:21" | sed -E 's/^[^ ]+ //' > "$tmp/valid.txt"
bible -f "Revelation 1:1-Revelation 19:21" | sed -E 's/^[^ ]+ //' > "$tmp/revelation_train.txt"
bible -f "Revelation 20:1-Revelation 22:21" | sed -E 's/^[^ ]+ //' > "$tmp/revelation_valid.txt"
"$trident" tokenize --no-progress --output "$out/train.bin" "$tmp/train.txt"
"$trident" tokenize --no-progress --output "$out/valid.bin" "$tmp/valid.txt"
"$trident" tokenize --no-progress --output "$out/revelation_train.bin" "$tmp/revelation_train.txt"
"$trident" tokenize --no-progress --output "$out/revelation_valid.bin" "$tmp/revelation_valid.txt"
