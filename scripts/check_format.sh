#!/usr/bin/env bash
# Fails, naming the files, when a C++ or CUDA source differs from what .clang-format makes of
# it, or a function or file breaks the code size limits (scripts/check_code_size.py).
# Usage: scripts/check_format.sh [--fix]   (--fix rewrites the formatting in place instead)
# The style is pinned to clang-format 14 (Debian's clang-format-14): other versions format a
# few constructs differently.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if ! command -v clang-format-14 >/dev/null; then
  if [[ $(id -u) -eq 0 ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends clang-format-14 \
      >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -q --no-install-recommends clang-format-14; }
  else
    echo "check_format: clang-format-14 is missing: sudo apt-get install clang-format-14" >&2
    exit 1
  fi
fi
mapfile -t files < <(git ls-files -- 'src/*' 'kernels/*' 'model/*' 'data/*' 'tests/*' |
                     grep -E '\.(cpp|h|cu|cuh)$')
if [[ "${1:-}" == "--fix" ]]; then
  clang-format-14 -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  clang-format-14 --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "check_format: ${#bad[@]} files differ from .clang-format (scripts/check_format.sh --fix):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files follow .clang-format"
# The code size limits (docs/ARCHITECTURE.md, "Code size"): functions and files.
python3 "$root/scripts/check_code_size.py"
