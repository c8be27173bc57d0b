#!/bin/sh
# Runs a command that must fail and checks what it printed (the ctest entries mpi.failure.*).
# Usage: check_failure.sh 'EXPECTED LINE'... -- COMMAND...
# Passes when COMMAND exits non-zero and its output (stdout and stderr) holds each expected
# line exactly once, as a whole line, and no other line that starts `trident: error:`.
expected=""
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
    expected="$expected$1
"
    shift
done
shift
output=$("$@" 2>&1)
status=$?
printf '%s\n' "$output"
failed=0
if [ "$status" -eq 0 ]; then
    echo "check_failure: expected a non-zero exit status" >&2
    failed=1
fi
printf '%s' "$expected" | while IFS= read -r line; do
    count=$(printf '%s\n' "$output" | grep -c -x -F -- "$line")
    if [ "$count" -ne 1 ]; then
        echo "check_failure: expected the line '$line' once, found it $count times" >&2
        exit 1
    fi
done || failed=1
errors=$(printf '%s\n' "$output" | grep -c '^trident: error:')
wanted=$(printf '%s' "$expected" | grep -c '')
if [ "$errors" -ne "$wanted" ]; then
    echo "check_failure: $errors lines start 'trident: error:', expected $wanted" >&2
    failed=1
fi
[ "$failed" -eq 0 ] && echo "check_failure: ok (exit status $status)"
exit "$failed"
