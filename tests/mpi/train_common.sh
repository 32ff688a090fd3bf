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
