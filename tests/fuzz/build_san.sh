#!/usr/bin/env bash
# Configures and builds the sanitizer tree (clang, -DDF_FUZZ=ON: ASan + UBSan everywhere plus the libFuzzer
# targets) next to the normal build, for the `sanitize` and `fuzz` tests. Args: <source dir> <build dir>
set -euo pipefail
SRC=$1 OUT=$2
command -v clang++ >/dev/null ||
  { echo "clang++ is missing; HINT: apt-get install clang libclang-rt-14-dev libomp-14-dev (setup.sh does)"; exit 1; }
mkdir -p "$OUT"
# Line tables are all the debug information a sanitizer report needs for file:line stack frames; full -g makes
# every object larger (src/core/config.cpp: 3.7 MB against 2.5 MB) and every compile and link of this tree slower.
# -O1, the level AddressSanitizer's documentation recommends (more optimisation can remove a faulty access before
# it is checked), compiles in a quarter less CPU time than -O2 (src/train/checkpoint.cpp: 7.5 s against 10.1 s).
# Ninja for a new tree (launch/setup.sh says why); a tree configured earlier keeps its generator.
generator=()
[ ! -f "$OUT/CMakeCache.txt" ] && command -v ninja >/dev/null && generator=(-G Ninja)
CC=clang CXX=clang++ cmake -S "$SRC" -B "$OUT" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDF_ENABLE_CUDA=OFF -DDF_FUZZ=ON \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only -DNDEBUG" \
  >"$OUT/configure.log" 2>&1 || { cat "$OUT/configure.log"; exit 1; }
# Every core: GNU nproc honours OMP_NUM_THREADS, which launch/setup.sh sets to 1 for the tests.
jobs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
# Only what the sanitize and fuzz tests run: the unit tests, dflash_mpi (some of them run it) and the libFuzzer
# targets. The GPU tests, which skip themselves without a device, are not built in this tree.
targets=(dflash_mpi)
for f in "$SRC"/tests/unit/test_*.cpp "$SRC"/tests/fuzz/fuzz_*.cpp; do targets+=("$(basename "$f" .cpp)"); done
cmake --build "$OUT" -j"$jobs" --target "${targets[@]}" 2>&1 | grep -vE '^\[ *[0-9]+(%|/[0-9]+)\] (Building|Linking|Built)' || true
cmake --build "$OUT" -j"$jobs" --target "${targets[@]}" >/dev/null  # the exit status (the line above filters)
