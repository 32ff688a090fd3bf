#!/usr/bin/env bash
# Exports every SpecForge-written drafter golden (tests/golden/drafter*/model) with the built dflash_mpi
# (`export --drafter`) and loads each export into the pinned SpecForge class with check_export_specforge.py:
# one line per golden, exit status 1 when any fails. Needs python3 with torch, transformers and safetensors
# (the GPU machine; it runs on the CPU), .peer/SpecForge (a6b6b023) and .peer/SpecForge-dflash2 (5943b2f)
# or the trees given.
#
#   tests/golden/check_export_all.sh BUILD_DIR [--specforge DIR] [--specforge-dflash2 DIR]
set -u
usage() {
  echo "usage: $0 BUILD_DIR [--specforge DIR] [--specforge-dflash2 DIR]" >&2
  exit 2
}
[ $# -ge 1 ] || usage
BUILD=$1
shift
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
SPECFORGE=$REPO/.peer/SpecForge
SPECFORGE_DFLASH2=$REPO/.peer/SpecForge-dflash2
while [ $# -gt 0 ]; do
  case $1 in
  --specforge) [ $# -ge 2 ] || usage; SPECFORGE=$2; shift 2 ;;
  --specforge-dflash2) [ $# -ge 2 ] || usage; SPECFORGE_DFLASH2=$2; shift 2 ;;
  *) usage ;;
  esac
done
BIN=$BUILD/dflash_mpi
[ -x "$BIN" ] || { echo "$0: $BIN is not an executable; HINT: build it (cmake --build $BUILD --target dflash_mpi)" >&2; exit 2; }
for tree in "$SPECFORGE" "$SPECFORGE_DFLASH2"; do
  [ -d "$tree/specforge" ] || { echo "$0: no SpecForge tree at $tree; HINT: pass --specforge / --specforge-dflash2" >&2; exit 2; }
done

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failed=0
for golden in drafter drafter_domino drafter_dspark_vanilla drafter_dspark_gated drafter_dspark_rnn drafter_dflash2; do
  case $golden in
  drafter) kind=dflash tree=$SPECFORGE ;;
  drafter_domino) kind=domino tree=$SPECFORGE ;;
  drafter_dspark_*) kind=dspark tree=$SPECFORGE ;;
  drafter_dflash2) kind=dflash2 tree=$SPECFORGE_DFLASH2 ;;
  esac
  if ! "$BIN" export --drafter "$REPO/tests/golden/$golden/model" --out "$TMP/$golden" >"$TMP/$golden.log" 2>&1; then
    echo "FAIL $golden: dflash_mpi export failed:"
    cat "$TMP/$golden.log"
    failed=1
    continue
  fi
  python3 "$HERE/check_export_specforge.py" --kind "$kind" --export "$TMP/$golden" \
    --golden "$REPO/tests/golden/$golden" --specforge "$tree" || failed=1
done
[ $failed = 0 ] && echo "all exports load into SpecForge's classes with identical outputs" || echo "some exports FAILED"
exit $failed
