#!/usr/bin/env bash
# The main job: install and build if needed, prepare the default corpus if missing, and train
# the default config on it. Extra arguments go to `trident train` (e.g. --set training.steps=50).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/setup.sh
for f in train valid revelation_train revelation_valid; do
    [[ -f data/kjv/gpt2/$f.bin ]] || { scripts/prepare_kjv.sh; break; }
done
exec build/trident train --config configs/default.yaml "$@"
