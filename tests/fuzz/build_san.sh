#!/usr/bin/env bash
# Configures and builds the sanitizer tree (clang, -DDF_FUZZ=ON: ASan + UBSan everywhere plus the libFuzzer
# targets) next to the normal build, for the `sanitize` and `fuzz` tests. Args: <source dir> <build dir>
set -euo pipefail
SRC=$1 OUT=$2
command -v clang++ >/dev/null ||
  { echo "clang++ is missing; HINT: apt-get install clang libclang-rt-14-dev libomp-14-dev (setup.sh does)"; exit 1; }
mkdir -p "$OUT"
CC=clang CXX=clang++ cmake -S "$SRC" -B "$OUT" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDF_ENABLE_CUDA=OFF -DDF_FUZZ=ON \
  >"$OUT/configure.log" 2>&1 || { cat "$OUT/configure.log"; exit 1; }
cmake --build "$OUT" -j"$(nproc)" 2>&1 | grep -vE '^\[ *[0-9]+%\] (Building|Linking|Built)' || true
cmake --build "$OUT" -j1 >/dev/null  # the exit status of the build (the line above filters its output)
