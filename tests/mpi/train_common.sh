# Shared by the MPI training tests: a tiny corpus and a config writer. Sourced with BIN, SRC, MPIEXEC set.
set -uo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

"$BIN" data synth --out "$TMP/tokens.h5" --vocab 255 --sequences 400 --min-len 24 --max-len 96 --seed 3 >/dev/null ||
  { echo "FAIL: data synth"; exit 1; }

# write_config FILE RUN_DIR TARGETS DRAFTERS MAX_STEPS [extra TOML lines...]: the tiny test run config.
source "$SRC/tests/mpi/tiny_config.sh"
write_config() { tiny_config "$1" "$2" "$TMP/tokens.h5" "${@:3}"; }

# run_mpi NP LOG args...: runs dflash_mpi under mpirun; returns its exit code.
run_mpi() {
  local np=$1 log=$2
  shift 2
  timeout 300 "$MPIEXEC" --oversubscribe -np "$np" "$BIN" "$@" >"$log" 2>&1
}

# starts FILE: one line "step=<s> resumed_from=<path> run_id=<id>" per start marker of a metrics.jsonl.
starts() {
  python3 -c 'import json,sys
for j in map(json.loads, open(sys.argv[1])):
    if j.get("event") == "start":
        print("step=%d resumed_from=%s run_id=%s" % (j["step"], j["resumed_from"], j["run_id"]))' "$1"
}

# resumes_like RUN_DIR TOML STEP TOTAL ATOL LABEL: resumes TOML's run from RUN_DIR's checkpoint of STEP in a fresh
# run dir (1 target + 1 drafter) and checks that steps STEP+1..TOTAL give RUN_DIR's losses within ATOL (0: exactly).
resumes_like() {
  local dir=$1 toml=$2 step=$3 total=$4 atol=$5 label=$6 ck
  ck=$(printf 'step_%08d.h5' "$step")
  rm -rf "$TMP/res" && mkdir -p "$TMP/res/checkpoints"
  cp "$dir/checkpoints/$ck" "$TMP/res/checkpoints/" && echo "$ck" >"$TMP/res/checkpoints/latest"
  sed "s|$dir|$TMP/res|" "$toml" >"$TMP/res.toml"
  if ! run_mpi 2 "$TMP/res.log" --config "$TMP/res.toml"; then
    fail "$label: resume run"; tail -30 "$TMP/res.log"; return
  fi
  python3 - "$dir/metrics.jsonl" "$TMP/res/metrics.jsonl" "$step" "$total" "$atol" <<'PY' || fail "$label: the resumed run's losses differ"
import json, sys
step, total, atol = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
a = [json.loads(x)["loss"] for x in open(sys.argv[1]) if '"loss"' in x][step:]
b = [json.loads(x)["loss"] for x in open(sys.argv[2]) if '"loss"' in x]
worst = max(abs(x - y) for x, y in zip(a, b)) if len(a) == len(b) == total - step else float("inf")
print(f"resume of step {step}: steps {step + 1}..{total} differ by at most {worst:.3g} "
      f"({'bit-identical' if worst == 0 else 'not bit-identical'})")
sys.exit(0 if worst <= atol else 1)
PY
}

# kind_trains_and_resumes KIND CONFIG_FN: CONFIG_FN FILE RUN_DIR TARGETS DRAFTERS MAX_STEPS writes the tiny test
# config with drafter.kind KIND's head. 1 target + 2 drafters train 24 steps in $TMP/straight with a falling loss;
# 12 steps, stop, resume, 12 more in $TMP/split give the same losses bit for bit (the kind's schedules follow the
# step, so they resume too); that run dir resumed as a DFlash drafter is refused naming drafter.kind, even when
# the change is allowed.
kind_trains_and_resumes() {
  local kind=$1 config=$2
  "$config" "$TMP/straight.toml" "$TMP/straight" 1 2 24
  run_mpi 3 "$TMP/straight.log" --config "$TMP/straight.toml" || { fail "$kind training run"; tail -20 "$TMP/straight.log"; }
  python3 - "$TMP/straight/metrics.jsonl" <<'PY' || fail "the $kind drafter did not learn"
import json, sys
loss = [json.loads(x)["loss"] for x in open(sys.argv[1]) if '"loss"' in x]
first, last = sum(loss[:4]) / 4, sum(loss[-4:]) / 4
print(f"{len(loss)} steps; mean loss of the first 4 {first:.4f}, of the last 4 {last:.4f}")
assert len(loss) == 24 and last < first, (len(loss), first, last)
PY
  "$config" "$TMP/split.toml" "$TMP/split" 1 2 24
  run_mpi 3 "$TMP/half1.log" --config "$TMP/split.toml" --stop-at-step 12 || { fail "first half"; tail -20 "$TMP/half1.log"; }
  run_mpi 3 "$TMP/half2.log" --config "$TMP/split.toml" || { fail "second half"; tail -20 "$TMP/half2.log"; }
  if [ "$(losses "$TMP/straight/metrics.jsonl")" == "$(losses "$TMP/split/metrics.jsonl")" ]; then
    echo "ok: $kind: 24 straight == 12 + resume + 12"
  else
    fail "the resumed $kind run's losses differ"
    paste <(losses "$TMP/straight/metrics.jsonl") <(losses "$TMP/split/metrics.jsonl")
  fi
  write_config "$TMP/dflash.toml" "$TMP/split" 1 2 30
  if run_mpi 3 "$TMP/dflash.log" --config "$TMP/dflash.toml" --allow-change drafter.kind; then
    fail "a DFlash resume of a $kind checkpoint ran"
  else
    grep -q "'drafter.kind' is \"dflash\" but .* trained a \"$kind\" drafter" "$TMP/dflash.log" ||
      fail "the refused resume names no drafter.kind: $(grep -m2 -i error "$TMP/dflash.log")"
  fi
}

# kind_recipes_check KIND BACKEND RECIPE:MODEL...: each configs/RECIPE.toml with its target moved to the fixtures'
# MODEL config and its data and run dir here (grad_accum 1: the test corpus makes few batches) passes `config
# check` with its CUDA drafter (BACKEND cuda: KIND's head exists there) or is refused naming drafter.kind and
# the CUDA backend (BACKEND cpu: KIND's ops exist on the CPU backend only); on drafter.device = "cpu" it passes
# and the plan names the kind. The logs stay in $TMP/RECIPE.log and $TMP/RECIPE.cpu.log.
kind_recipes_check() {
  local kind=$1 backend=$2 r recipe model
  shift 2
  for r in "$@"; do
    recipe=${r%%:*} model=${r##*:}
    sed -e "s|^model = .*|model = \"$SRC/tests/fixtures/models/$model\"|" -e "s|^train = .*|train = [\"$TMP/tokens.h5\"]|" \
      -e "s|^dir = .*|dir = \"$TMP/$recipe\"|" -e "s|^grad_accum = .*|grad_accum = 1|" "$SRC/configs/$recipe.toml" \
      >"$TMP/$recipe.toml"
    if "$BIN" config check --config "$TMP/$recipe.toml" >"$TMP/$recipe.log" 2>&1; then
      [ "$backend" == cuda ] && grep -q "config OK" "$TMP/$recipe.log" ||
        fail "config check of configs/$recipe.toml passed a CUDA $kind drafter, or printed no 'config OK'"
    else
      [ "$backend" == cpu ] && grep -q "drafter.kind = \"$kind\": the cuda backend has no $kind " \
        "$TMP/$recipe.log" || fail "config check of configs/$recipe.toml (CUDA drafter): $(tail -3 "$TMP/$recipe.log")"
    fi
    sed -i 's|^device = "cuda"  *# the drafter|device = "cpu"  # the drafter|' "$TMP/$recipe.toml"
    "$BIN" config check --config "$TMP/$recipe.toml" >"$TMP/$recipe.cpu.log" 2>&1 &&
      grep -q "config OK" "$TMP/$recipe.cpu.log" ||
      fail "config check of configs/$recipe.toml on a CPU drafter: $(tail -3 "$TMP/$recipe.cpu.log")"
    grep -q "drafter: kind $kind" "$TMP/$recipe.cpu.log" || fail "configs/$recipe.toml: the plan names no $kind drafter"
  done
}

# kind_heldout_eval KIND CONFIG_FN: held-out features of the test corpus extracted with $TMP/target for
# $TMP/straight.toml's drafter (its taps, and the final hidden state when its loss reads it), then a 6-step run
# of CONFIG_FN's config (1 target + 1 drafter) evaluates them every 3 steps ([eval]).
kind_heldout_eval() {
  local kind=$1 config=$2
  "$BIN" extract --model "$TMP/target" --tokens "$TMP/tokens.h5" --for-config "$TMP/straight.toml" \
    --out "$TMP/heldout.h5" >"$TMP/extract.log" 2>&1 || fail "extract held-out features: $(tail -3 "$TMP/extract.log")"
  "$config" "$TMP/ev.toml" "$TMP/ev" 1 1 6
  printf '[eval]\ndata = ["%s"]\ninterval = 3\nmax_sequences = 20\n' "$TMP/heldout.h5" >>"$TMP/ev.toml"
  if run_mpi 2 "$TMP/ev.log" --config "$TMP/ev.toml"; then
    python3 - "$TMP/ev/metrics.jsonl" "$kind" <<'PY' || fail "held-out metrics of the $kind run"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ev = [(r["step"], r["eval_loss"], r["eval_tau"]) for r in rows if "eval_loss" in r]
assert [e[0] for e in ev] == [3, 6] and all(0 < l < 10 and 1 <= t <= 8 for _, l, t in ev), ev
print(f"ok: [eval] of the {sys.argv[2]} run:", ev)
PY
  else
    fail "$kind training with [eval]"; tail -20 "$TMP/ev.log"
  fi
}

# kind_eval KIND: `eval` against $TMP/target (a random tiny target, made here) decodes with the export in
# $TMP/drafter (3 prompts of 16 new tokens, per prompt in $TMP/eval.jsonl, log $TMP/eval.log) and with the
# checkpoint of $TMP/straight.toml (2 prompts of 8), each printing τ.
kind_eval() {
  local kind=$1
  "$BIN" model init --hf-config "$SRC/configs/tiny-target.json" --seed 1 --out "$TMP/target" >/dev/null 2>&1 || fail "model init"
  "$BIN" eval --target "$TMP/target" --drafter "$TMP/drafter" --prompts "$TMP/tokens.h5" --num-prompts 3 \
    --max-new-tokens 16 --out "$TMP/eval.jsonl" >"$TMP/eval.log" 2>&1 || fail "eval of the $kind drafter: $(tail -3 "$TMP/eval.log")"
  grep -qE "^tau [0-9]+\.[0-9]{3} over 3 prompts$" "$TMP/eval.log" && echo "ok: eval: $(grep '^tau' "$TMP/eval.log")" ||
    fail "eval printed no tau: $(tail -3 "$TMP/eval.log")"
  "$BIN" eval --target "$TMP/target" --config "$TMP/straight.toml" --prompts "$TMP/tokens.h5" --num-prompts 2 \
    --max-new-tokens 8 >"$TMP/eval_ck.log" 2>&1 || fail "eval of the $kind checkpoint: $(tail -3 "$TMP/eval_ck.log")"
  grep -qE "^tau [0-9]+\.[0-9]{3} over 2 prompts$" "$TMP/eval_ck.log" ||
    fail "eval of the checkpoint printed no tau: $(tail -3 "$TMP/eval_ck.log")"
}

# loss_fell LABEL METRICS STEPS: METRICS (a run's metrics.jsonl) holds STEPS losses and the mean of the last 8 is
# below the mean of the first 8.
loss_fell() {
  python3 - "$1" "$2" "$3" <<'PY' || fail "the $1's loss did not fall over $3 steps"
import json, sys
label, path, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
l = [json.loads(x)["loss"] for x in open(path) if '"loss"' in x]
first, last = sum(l[:8]) / 8, sum(l[-8:]) / 8
print(f"{label}: {len(l)} steps, mean loss of the first 8 {first:.4f}, of the last 8 {last:.4f}")
sys.exit(0 if len(l) == steps and last < first else 1)
PY
}

# kind_cuda_eval LABEL CONFIG [EVAL_ARGS...]: exports CONFIG's drafter to $TMP/drafter, then `eval --device cuda`
# against a random tiny target ($TMP/target) decodes 3 prompts of 24 new tokens once per EVAL_ARGS word list ("" or
# none: no extra arguments), each printing τ and writing 3 continuations of 24 tokens to $TMP/eval.jsonl.
kind_cuda_eval() {
  local label=$1 config=$2 extra
  shift 2
  [ $# -gt 0 ] || set -- ""
  "$BIN" export --config "$config" --out "$TMP/drafter" >"$TMP/export.log" 2>&1 || fail "export: $(tail -3 "$TMP/export.log")"
  "$BIN" model init --hf-config "$SRC/configs/tiny-target.json" --seed 5 --out "$TMP/target" >/dev/null 2>&1 || fail "model init"
  for extra in "$@"; do
    # shellcheck disable=SC2086 # extra is a word list
    if "$BIN" eval --target "$TMP/target" --drafter "$TMP/drafter" --prompts "$TMP/tokens.h5" --num-prompts 3 \
      --max-new-tokens 24 --device cuda $extra --out "$TMP/eval.jsonl" >"$TMP/eval.log" 2>&1; then
      grep -qE "^tau [0-9]+\.[0-9]{3} over 3 prompts" "$TMP/eval.log" || fail "eval $extra printed no tau: $(tail -3 "$TMP/eval.log")"
      python3 - "$TMP/eval.jsonl" <<'PY' || fail "eval --device cuda $extra of the $label: jsonl"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 3 and all(len(r["tokens"]) == 24 and r["tau"] >= 1 for r in rows), rows
PY
      echo "ok: eval --device cuda $extra with the $label: $(grep '^tau' "$TMP/eval.log")"
    else
      fail "eval --device cuda $extra of the $label: $(tail -5 "$TMP/eval.log")"
    fi
  done
}
