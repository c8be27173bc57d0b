#!/usr/bin/env bash
# Makes the data of the GPT-2 124M recipe (configs/gpt2-124m.yaml) from the largest English
# text Debian ships: GCIDE, the Collaborative International Dictionary of English (Webster's
# Revised Unabridged of 1913, public domain, with GNU additions under the GPL; package
# dict-gcide, 40 MB of text) and the King James Bible (bible-kjv, 4.4 MB), tokenized with
# GPT-2's BPE into llm.c shards. The dictionary's last 20,000 lines (from "wild" to
# "zythum") are the validation set; its other entries and the Bible, the training set.
#
# It is a corpus this machine can get, not GPT-2's: OpenWebText and FineWeb are not packaged.
# With llm.c shards of either made elsewhere, point the recipe at them instead:
#   --set data.train='data/fineweb/train_*.bin' --set data.valid=data/fineweb/val_000000.bin
#
# Usage: scripts/prepare_gpt2.sh [OUT_DIR]   (default data/gpt2: train.bin, valid.bin)
# Needs the built binary (scripts/setup.sh) and the bible-kjv package; dict-gcide is unpacked
# from its .deb (apt-get download: no root, no dictionary server) unless it is installed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/data/gpt2}
trident=${TRIDENT:-$root/build/trident}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

dictionary=/usr/share/dictd/gcide.dict.dz
if [[ ! -f $dictionary ]]; then
  echo "prepare_gpt2: unpacking Debian's dict-gcide"
  mkdir -m 777 "$tmp/deb"  # apt's download user writes there
  download() { (cd "$tmp/deb" && apt-get download -q dict-gcide >/dev/null 2>&1); }
  # Without package lists (a fresh machine) root fetches them first.
  download || { [[ $(id -u) -eq 0 ]] && apt-get update -q >/dev/null && download; } || {
    echo "prepare_gpt2: cannot download dict-gcide (apt-get update first, as root)" >&2
    exit 1
  }
  dpkg-deb -x "$tmp"/deb/dict-gcide_*.deb "$tmp/gcide"
  dictionary=$tmp/gcide/usr/share/dictd/gcide.dict.dz
fi
command -v bible >/dev/null || {
  echo "prepare_gpt2: the bible command is missing: apt-get install bible-kjv" >&2
  exit 1
}

# The dictionary is gzip-compatible (dictzip); its entries, separated by blank lines, become
# documents. The Bible, verse by verse without the references, is one.
zcat "$dictionary" > "$tmp/gcide.txt"
lines=$(wc -l < "$tmp/gcide.txt")
head -n $((lines - 20000)) "$tmp/gcide.txt" > "$tmp/train_gcide.txt"
tail -n 20000 "$tmp/gcide.txt" > "$tmp/valid.txt"
bible -f "Genesis 1:1-Revelation 22:21" | sed -E 's/^[^ ]+ //' > "$tmp/kjv.txt"

mkdir -p "$out"
"$trident" tokenize --no-progress --split-on '\n\n' --output "$out/train.bin" \
  "$tmp/train_gcide.txt" "$tmp/kjv.txt"
"$trident" tokenize --no-progress --split-on '\n\n' --output "$out/valid.bin" "$tmp/valid.txt"
