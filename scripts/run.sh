#!/usr/bin/env bash
# The main job: install and build if needed, prepare the default corpus if missing, and train
# the default config on it. Extra arguments go to `trident train` (e.g. --set training.steps=50).
# Set-up (scripts/setup.sh) installs what the README's commands after this one use too
# (scripts/plot_metrics' matplotlib among them) and builds the trident binary alone: the tests
# are built by scripts/test.sh. TRIDENT_SKIP_SETUP=1 skips the install and build, for a build/
# that is ready (the README's walk test runs the binary under test so).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
[[ -n "${TRIDENT_SKIP_SETUP:-}" ]] || scripts/setup.sh
for f in train valid revelation_train revelation_valid; do
    [[ -f data/kjv/gpt2/$f.bin ]] || { scripts/prepare_kjv.sh; break; }
done
exec build/trident train --config configs/default.yaml "$@"
