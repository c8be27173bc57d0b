#!/usr/bin/env bash
# The main job: install and build if needed, prepare the default corpus if missing, and train
# the default config on it. Extra arguments go to `trident train` (e.g. --set training.steps=50).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/setup.sh
[[ -f data/kjv/gpt2/train.bin && -f data/kjv/gpt2/valid.bin ]] || scripts/prepare_kjv.sh
exec build/trident train --config configs/default.yaml "$@"
