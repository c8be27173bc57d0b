#!/usr/bin/env bash
# The layering test: each probe library is built against one layer's libraries alone; the
# upward probes must fail on their include and the downward one must build.
# Usage: check.sh BUILD_DIR
set -u
build=$1 status=0
probe() {  # target, expected (builds | missing HEADER)
    local out
    out=$(cmake --build "$build" --target "$1" 2>&1)
    local rc=$?
    if [[ $2 == builds ]]; then
        ((rc == 0)) || { echo "FAIL $1 did not build:"; echo "$out" | tail -5; status=1; return; }
        echo "ok   $1 builds"
    elif ((rc == 0)); then
        echo "FAIL $1 built, but its include of $3 goes against the layers"; status=1
    elif grep -q "$3: No such file or directory" <<<"$out"; then
        echo "ok   $1: $3 is out of reach"
    else
        echo "FAIL $1 failed for another reason:"; echo "$out" | tail -5; status=1
    fi
}
probe trident_layering_downward builds
probe trident_layering_kernels missing parallel/comm.h
probe trident_layering_model missing train/trainer.h
exit $status
