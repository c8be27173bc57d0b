#!/usr/bin/env bash
# Runs a build command with its whole output appended to a log, showing one progress line from
# ninja's "[done/total]" status instead: redrawn in place on a terminal, a line at each quarter
# otherwise (a CI log). A failed build shows the log's end, where the compiler's errors are.
# Usage: scripts/build_progress.sh LOG WHAT COMMAND [ARG...]   (WHAT: "the trident binary")
set -uo pipefail
log=$1 what=$2
shift 2
start=$SECONDS
terminal=0
[[ -t 1 ]] && terminal=1

"$@" 2>&1 | tee -a "$log" | {
  quarter=-1
  while IFS= read -r line; do
    # Ninja's own steps (CMake re-checking its globs) count no building.
    [[ $line =~ ^\[([0-9]+)/([0-9]+)\]\ (Building|Linking) ]] || continue
    done_steps=${BASH_REMATCH[1]} total=${BASH_REMATCH[2]}
    if ((terminal)); then
      printf '\rsetup: building %s: %d/%d' "$what" "$done_steps" "$total"
    elif ((4 * done_steps / total > quarter)); then
      quarter=$((4 * done_steps / total))
      echo "setup: building $what: $done_steps/$total"
    fi
  done
  ((terminal)) && printf '\n'
}
status=${PIPESTATUS[0]}
if ((status != 0)); then
  echo "setup: building $what failed; the end of $log (the whole build's output):" >&2
  tail -n 40 "$log" >&2
  exit "$status"
fi
echo "setup: built $what in $((SECONDS - start)) s"
