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
