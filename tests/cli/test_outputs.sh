#!/usr/bin/env bash
# Outputs never overwrite inputs: every writing command (data convert/synth, extract, model init, export,
# topo rankfile/nccl-xml) refuses an --out that is one of its inputs (even with --force, whatever the spelling:
# ./x, a symlink, a folder holding the input) and an existing non-empty --out unless --force; the refused
# files are left byte-identical. Also: --stop-at-step 0 or negative is an error.
# Args: <dflash_mpi binary> <source dir>
set -uo pipefail
BIN=$(realpath "$1")
SRC=$(realpath "$2")
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP" || exit 1
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# refused "<needle>" FILE cmd args...: must exit non-zero naming the problem, and leave FILE unchanged.
refused() {
  local needle=$1 file=$2
  shift 2
  local before out
  before=$(find "$file" -type f -exec md5sum {} + 2>/dev/null | sort)
  if out=$("$@" 2>&1); then fail "accepted: $*"; echo "$out"
  elif ! grep -qF -- "$needle" <<<"$out"; then fail "message lacks '$needle': $*"; echo "$out"
  elif [ "$(find "$file" -type f -exec md5sum {} + 2>/dev/null | sort)" != "$before" ]; then fail "$file changed: $*"
  else echo "ok: $needle"; fi
}
accepted() { "$@" >/dev/null 2>&1 || { fail "refused: $*"; "$@"; }; }

# data convert / synth
echo '{"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}' >in.jsonl
ln -s in.jsonl link.jsonl
refused "would overwrite the input in.jsonl" in.jsonl \
  "$BIN" data convert --in in.jsonl --out ./in.jsonl --vocab 10 --force
refused "would overwrite the input link.jsonl" in.jsonl "$BIN" data convert --in link.jsonl --out in.jsonl --vocab 10
accepted "$BIN" data convert --in in.jsonl --out tok.h5 --vocab 10
refused "--out tok.h5 already exists" tok.h5 "$BIN" data convert --in in.jsonl --out tok.h5 --vocab 10
accepted "$BIN" data convert --in in.jsonl --out tok.h5 --vocab 10 --force
accepted "$BIN" data synth --out syn.h5 --vocab 256 --sequences 3 --min-len 4 --max-len 8
refused "--out syn.h5 already exists" syn.h5 \
  "$BIN" data synth --out syn.h5 --vocab 256 --sequences 3 --min-len 4 --max-len 8

# model init over a real checkpoint, and extract over its own token file
accepted "$BIN" model init --hf-config "$SRC/configs/tiny-target.json" --out model
refused "--out model is a folder that already holds files" model \
  "$BIN" model init --hf-config "$SRC/configs/tiny-target.json" --out model --seed 2
refused "would overwrite the input model/config.json (it lies inside that folder)" model \
  "$BIN" model init --hf-config model/config.json --out model --force
mkdir sharded && echo '{"weight_map": {}}' >sharded/model.safetensors.index.json
refused "holds a sharded checkpoint" sharded \
  "$BIN" model init --hf-config "$SRC/configs/tiny-target.json" --out sharded --force
refused "would overwrite the input syn.h5" syn.h5 "$BIN" extract --model model --tokens syn.h5 --out syn.h5 --force
accepted "$BIN" extract --model model --tokens syn.h5 --out feat.h5
refused "--out feat.h5 already exists" feat.h5 "$BIN" extract --model model --tokens syn.h5 --out feat.h5

# export: the run dir holds the checkpoint read; an earlier export needs --force
mkdir -p run/checkpoints exported
echo "x" >run/checkpoints/step_00000001.h5
echo "step_00000001.h5" >run/checkpoints/latest
echo "keep" >exported/config.json
printf '[run]\ndir = "%s/run"\n[target]\nrandom_config = "%s/configs/tiny-target.json"\ndevice = "cpu"\n' \
  "$TMP" "$SRC" >run.toml
printf '[drafter]\nmask_token_id = 255\n' >>run.toml
refused "would overwrite the input" run "$BIN" export --config run.toml --out run --force
refused "--out exported is a folder that already holds files" exported "$BIN" export --config run.toml --out exported
# export --drafter: a Hugging Face drafter folder in, never overwritten; --config and --drafter exclude each other
cp -r "$SRC/tests/golden/drafter/model" hf_drafter
refused "would overwrite the input" hf_drafter "$BIN" export --drafter hf_drafter --out hf_drafter --force
refused "--config excludes --drafter" hf_drafter "$BIN" export --drafter hf_drafter --config run.toml --out re
refused "give --config" run.toml "$BIN" export --out re
accepted "$BIN" export --drafter hf_drafter --out re
refused "--out re is a folder that already holds files" re "$BIN" export --drafter hf_drafter --out re

# topo rankfile / nccl-xml: the sysfs tree read, or an earlier file
cp -r "$SRC/tests/fixtures/sysfs/vm_8" sysfs
refused "would overwrite the input sysfs" sysfs "$BIN" topo nccl-xml --sysfs-root sysfs --out sysfs --force
accepted "$BIN" topo rankfile --targets 7 --drafters 1 --sysfs-root sysfs --hosts vm1 --out ranks.rf
refused "--out ranks.rf already exists" ranks.rf "$BIN" topo rankfile --targets 6 --drafters 2 --sysfs-root sysfs \
  --hosts vm1 --out ranks.rf
accepted "$BIN" topo rankfile --targets 6 --drafters 2 --sysfs-root sysfs --hosts vm1 --out ranks.rf --force
grep -q "targets=6 drafters=2" ranks.rf || fail "--force did not replace ranks.rf: $(head -2 ranks.rf)"

# --stop-at-step must be a step number (>= 1); where it lies against the resumed step is checked by the run.
for n in 0 -3; do
  refused "--stop-at-step: Value $n not in range 1" run.toml "$BIN" --config run.toml --stop-at-step "$n"
done
"$BIN" train --help | grep -q "above the step the run resumes from" ||
  fail "--help does not say what --stop-at-step means"
"$BIN" train --help | grep -q "DFLASH_STOP_FILE" ||
  fail "train --help does not say how to stop a run early"

echo "$fails failed"
[ $fails -eq 0 ]
