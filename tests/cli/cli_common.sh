# Shared by the command-line tests: a scratch folder, a failure counter and expect_fail. Sourced with BIN set.
set -uo pipefail
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0

# expect_fail "<needle in output>" cmd args...: the command must exit non-zero and print the needle.
expect_fail() {
  local needle=$1
  shift
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [ $rc -eq 0 ]; then
    echo "FAIL (exit 0): $*"; echo "$out"; fails=$((fails + 1))
  elif ! grep -qF -- "$needle" <<<"$out"; then
    echo "FAIL (message lacks '$needle'): $*"; echo "$out"; fails=$((fails + 1))
  else
    echo "ok: $needle"
  fi
}
