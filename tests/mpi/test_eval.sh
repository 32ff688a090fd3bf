#!/usr/bin/env bash
# `dflash_mpi eval` end to end: train the tiny drafter a few steps, export it, then measure its τ by speculative
# decoding against the same random target (from the HF export and from the checkpoint + config), regenerate the
# prompts' responses with the target (--generate), train with a held-out set ([eval]), and check that bad
# invocations fail with a message.
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
source "$SRC/tests/mpi/train_common.sh"
write_config "$TMP/run.toml" "$TMP/run" 1 1 12
run_mpi 2 "$TMP/train.log" --config "$TMP/run.toml" || { fail "training"; tail -20 "$TMP/train.log"; }
"$BIN" export --config "$TMP/run.toml" --out "$TMP/drafter" >"$TMP/export.log" 2>&1 ||
  { fail "export"; cat "$TMP/export.log"; }
# The training target is configs/tiny-target.json drawn with random_seed 1: the same model as a folder.
"$BIN" model init --hf-config "$SRC/configs/tiny-target.json" --seed 1 --out "$TMP/target" >/dev/null 2>&1 ||
  fail "model init"

# expect_out LOG TEXT: TEXT occurs in LOG.
expect_out() { grep -qE -- "$2" "$1" || fail "$1 lacks '$2': $(tail -5 "$1")"; }

if "$BIN" eval --target "$TMP/target" --drafter "$TMP/drafter" --prompts "$TMP/tokens.h5" --num-prompts 3 \
  --max-new-tokens 24 --out "$TMP/eval.jsonl" >"$TMP/eval.log" 2>&1; then
  expect_out "$TMP/eval.log" "^tau [0-9]+\.[0-9]{3} over 3 prompts$"
  expect_out "$TMP/eval.log" "acceptance length histogram \(blocks\):  1: [0-9]+"
  expect_out "$TMP/eval.log" "draft [0-9.]+ s .*verify [0-9.]+ s .*72 new tokens"
  python3 - "$TMP/eval.jsonl" <<'PY' || fail "eval.jsonl"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 3, rows
for r in rows:
    assert len(r["tokens"]) == 24 and r["new_tokens"] == 24, r
    assert 1 <= min(r["accept_lengths"]) and max(r["accept_lengths"]) <= 8, r
    assert abs(r["tau"] - sum(r["accept_lengths"]) / len(r["accept_lengths"])) < 1e-9, r
PY
  echo "ok: eval --drafter: $(grep '^tau' "$TMP/eval.log")"
else
  fail "eval --drafter"; cat "$TMP/eval.log"
fi
# What eval takes as the prompt (issue 28; the rule is token_data_prompt_length): a prompts JSONL converted without
# a loss_mask is decoded whole; a record whose mask steps 0->1 is cut there (a conversation's first assistant
# turn); an all-ones mask has no such step and is taken whole. `data info` says which the file looks like.
printf '%s\n' '{"input_ids": [5, 17, 200, 3, 9]}' '{"input_ids": [44, 2, 71, 8, 8, 120, 6, 31, 255]}' \
  '{"input_ids": [7, 99, 1]}' >"$TMP/p.jsonl"
printf '%s\n' '{"input_ids": [5, 17, 200, 3, 9, 1, 2, 3, 4], "loss_mask": [0, 0, 0, 0, 1, 1, 1, 1, 1]}' \
  '{"input_ids": [44, 2, 71, 8, 8, 120], "loss_mask": [0, 0, 1, 1, 1, 1]}' \
  '{"input_ids": [7, 99, 1, 3, 3], "loss_mask": [1, 1, 1, 1, 1]}' >"$TMP/c.jsonl"
# prompt_lengths LOG EVAL_JSONL WANT...: eval printed a tau over the prompts and their lengths are WANT.
prompt_lengths() {
  local log=$1 out=$2; shift 2
  expect_out "$log" "^tau [0-9]+\.[0-9]{3} over $# prompts$"
  python3 - "$out" "$@" <<'PY' || fail "$out: prompt lengths"
import json, sys
got = [json.loads(l)["prompt_tokens"] for l in open(sys.argv[1])]
assert got == [int(x) for x in sys.argv[2:]], (got, sys.argv[2:])
PY
}
fails_before=$fails
for f in p c; do
  "$BIN" data convert --in "$TMP/$f.jsonl" --out "$TMP/$f.h5" --vocab 256 >"$TMP/convert_$f.log" 2>&1 &&
    "$BIN" data info "$TMP/$f.h5" >"$TMP/info_$f.log" 2>&1 &&
    "$BIN" eval --target "$TMP/target" --drafter "$TMP/drafter" --prompts "$TMP/$f.h5" --max-new-tokens 8 \
      --out "$TMP/eval_$f.jsonl" >"$TMP/eval_$f.log" 2>&1 ||
    fail "convert -> info -> eval of $f.jsonl: $(cat "$TMP/convert_$f.log" "$TMP/info_$f.log" "$TMP/eval_$f.log")"
done
expect_out "$TMP/convert_p.log" "no record has a loss_mask, so none is written: .* eval takes each sequence whole"
expect_out "$TMP/info_p.log" "layout: looks like prompts: no sequence has a loss_mask 0->1 step \(the file has no"
prompt_lengths "$TMP/eval_p.log" "$TMP/eval_p.jsonl" 5 9 3
expect_out "$TMP/info_c.log" "layout: mixed: 2 sequences have a prompt followed by a response .* 1 have no such step"
prompt_lengths "$TMP/eval_c.log" "$TMP/eval_c.jsonl" 4 2 5
"$BIN" data info "$TMP/tokens.h5" >"$TMP/info_t.log" 2>&1 || fail "data info tokens.h5"
expect_out "$TMP/info_t.log" "layout: looks like training data: every sequence has a prompt"
[ "$fails" -eq "$fails_before" ] &&
  echo "ok: prompts file decoded whole ($(grep '^tau' "$TMP/eval_p.log")), conversations cut at the response"

if "$BIN" eval --target "$TMP/target" --checkpoint "$TMP/run/checkpoints/step_00000012.h5" --config "$TMP/run.toml" \
  --prompts "$TMP/tokens.h5" --num-prompts 2 --max-new-tokens 16 --block-size 4 >"$TMP/ck.log" 2>&1; then
  expect_out "$TMP/ck.log" "^tau [0-9.]+ over 2 prompts$"
  expect_out "$TMP/ck.log" "  4: [0-9]+ \([0-9.]+%\)$"
  echo "ok: eval --checkpoint --block-size 4: $(grep '^tau' "$TMP/ck.log")"
  # --config alone evaluates the run's latest checkpoint (step 12 here): the same numbers.
  "$BIN" eval --target "$TMP/target" --config "$TMP/run.toml" --prompts "$TMP/tokens.h5" --num-prompts 2 \
    --max-new-tokens 16 --block-size 4 >"$TMP/latest.log" 2>&1 || fail "eval --config: $(cat "$TMP/latest.log")"
  [ "$(grep '^tau' "$TMP/latest.log")" == "$(grep '^tau' "$TMP/ck.log")" ] || fail "eval --config != --checkpoint"
else
  fail "eval --checkpoint"; cat "$TMP/ck.log"
fi
if "$BIN" eval --generate --target "$TMP/target" --prompts "$TMP/tokens.h5" --num-prompts 4 --max-new-tokens 10 \
  --temperature 0.8 --top-p 0.9 --seed 3 --out "$TMP/gen.h5" >"$TMP/gen.log" 2>&1 &&
  "$BIN" data info "$TMP/gen.h5" >"$TMP/info.log" 2>&1; then
  expect_out "$TMP/gen.log" "generated 40 tokens for 4 prompts"
  expect_out "$TMP/info.log" "4 sequences"
  echo "ok: eval --generate -> $(grep -o '[0-9]* sequences, [0-9]* tokens' "$TMP/info.log" | head -1)"
  # Batched (3 + 1 side by side) and one at a time write the same file: each prompt draws its own stream.
  for b in 3 1; do
    "$BIN" eval --generate --target "$TMP/target" --prompts "$TMP/tokens.h5" --num-prompts 4 --max-new-tokens 10 \
      --temperature 0.8 --top-p 0.9 --seed 3 --batch $b --out "$TMP/gen_b$b.h5" >"$TMP/gen_b$b.log" 2>&1 ||
      fail "eval --generate --batch $b: $(cat "$TMP/gen_b$b.log")"
  done
  h5diff "$TMP/gen_b3.h5" "$TMP/gen_b1.h5" tokens tokens >/dev/null &&
    h5diff "$TMP/gen.h5" "$TMP/gen_b1.h5" tokens tokens >/dev/null && echo "ok: --batch 8, 3 and 1 write the same tokens" || fail "batched generation differs"
else
  fail "eval --generate"; cat "$TMP/gen.log" "$TMP/info.log"
fi

# Held-out evaluation during training: features of the first sequences as eval.data, evaluated every 4 steps.
"$BIN" extract --model "$TMP/target" --tokens "$TMP/tokens.h5" --for-config "$TMP/run.toml" --out "$TMP/heldout.h5" \
  >"$TMP/extract.log" 2>&1 || { fail "extract held-out features"; cat "$TMP/extract.log"; }
write_config "$TMP/ev.toml" "$TMP/ev" 1 1 10 "[eval]" "data = [\"$TMP/heldout.h5\"]" "interval = 4" "max_sequences = 30"
if run_mpi 2 "$TMP/ev.log" --config "$TMP/ev.toml"; then
  python3 - "$TMP/ev/metrics.jsonl" <<'PY' || fail "held-out metrics"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ev = [r["step"] for r in rows if "eval_loss" in r]
assert ev == [4, 8, 10], ev  # every 4 steps and at the end
for r in rows:
    if "eval_loss" in r:
        assert 0 < r["eval_loss"] < 10 and 1 <= r["eval_tau"] <= 8 and len(r["eval_acc"]) == 7, r
PY
  expect_out "$TMP/ev.log" "step +4/10 .* \| eval loss [0-9.]+ tau [0-9.]+$"
  echo "ok: [eval] held-out loss/tau at steps $(grep -o 'eval loss [0-9.]* tau [0-9.]*' "$TMP/ev.log" | tr '\n' ',')"
else
  fail "training with [eval]"; tail -20 "$TMP/ev.log"
fi

# Bad invocations name what is wrong.
expect_err() {
  local desc=$1 text=$2; shift 2
  if "$BIN" "$@" >"$TMP/err.log" 2>&1; then fail "$desc: succeeded"; return; fi
  grep -qF -- "$text" "$TMP/err.log" || fail "$desc: lacks '$text': $(cat "$TMP/err.log")"
}
expect_err "no drafter" "--drafter DIR (or --config T [--checkpoint F])" eval --target "$TMP/target" \
  --prompts "$TMP/tokens.h5"
# --device cuda: where a GPU is visible, the same evaluation on it (the committed tokens may part from the CPU's
# at a near tie of bf16 logits, so only the report is checked); elsewhere an error that says what to do.
if "$BIN" eval --target "$TMP/target" --drafter "$TMP/drafter" --prompts "$TMP/tokens.h5" --num-prompts 3 \
  --max-new-tokens 24 --device cuda --out "$TMP/eval_cuda.jsonl" >"$TMP/cuda.log" 2>&1; then
  expect_out "$TMP/cuda.log" "^tau [0-9]+\.[0-9]{3} over 3 prompts$"
  expect_out "$TMP/cuda.log" "draft [0-9.]+ s .*verify [0-9.]+ s .*72 new tokens"
  python3 - "$TMP/eval.jsonl" "$TMP/eval_cuda.jsonl" <<'PY' || fail "eval --device cuda jsonl"
import json, sys
cpu, gpu = ([json.loads(l) for l in open(f)] for f in sys.argv[1:3])
assert len(gpu) == 3 and all(len(r["tokens"]) == 24 for r in gpu), gpu
same = [next((i for i, (a, b) in enumerate(zip(c["tokens"], g["tokens"])) if a != b), 24) for c, g in zip(cpu, gpu)]
print("cuda vs cpu: greedy tokens agree for the first", same, "of 24 per prompt; tau cuda",
      [round(r["tau"], 3) for r in gpu], "cpu", [round(r["tau"], 3) for r in cpu])
PY
  echo "ok: eval --device cuda: $(grep '^tau' "$TMP/cuda.log")"
else
  grep -qF "HINT: --device cpu" "$TMP/cuda.log" || fail "eval --device cuda: $(cat "$TMP/cuda.log")"
  echo "ok: eval --device cuda without a GPU: $(grep -o 'shows no CUDA GPU.*' "$TMP/cuda.log" | head -1)"
fi
expect_err "generate without out" "--out F.h5" eval --generate --target "$TMP/target" --prompts "$TMP/tokens.h5"
python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c["hidden_size"]=32; json.dump(c,open(sys.argv[2],"w"))' \
  "$SRC/configs/tiny-target.json" "$TMP/other.json" &&
  "$BIN" model init --hf-config "$TMP/other.json" --out "$TMP/other" >/dev/null 2>&1 || fail "model init (other)"
expect_err "drafter for another target" "a drafter trained for this target" eval --target "$TMP/other" \
  --drafter "$TMP/drafter" --prompts "$TMP/tokens.h5"
# A DFlash2DraftModel config.json over a DFlash drafter's weights: refused naming the missing convolution.
mkdir -p "$TMP/dflash2" && cp "$TMP/drafter/model.safetensors" "$TMP/dflash2/" &&
  python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c["architectures"]=["DFlash2DraftModel"]
c["dflash_config"].update(conv_kernel_size=2, conv_group_size=16, selector_rank=8, selector_top_k=4)
json.dump(c,open(sys.argv[2],"w"))' "$TMP/drafter/config.json" "$TMP/dflash2/config.json" || fail "dflash2 config"
expect_err "a DFlash2 config over DFlash weights" "tensor 'layers.0.attention_conv.kernel_projection.weight' is missing" eval --target "$TMP/target" \
  --drafter "$TMP/dflash2" --prompts "$TMP/tokens.h5"
[ -e "$TMP/gen.h5.tmp" ] && fail "a temp file was left behind"
echo "$fails failed"
[ "$fails" -eq 0 ]
