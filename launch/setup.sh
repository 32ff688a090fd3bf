#!/usr/bin/env bash
# Shared set-up for demo.sh and test.sh: installs the Debian packages that are missing (idempotent),
# configures and builds into build/. Sourced, not executed; leaves BUILD_DIR and the phase times (DF_PHASES) set.
set -euo pipefail
ROOT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT_DIR/build}
# The wall time of each phase, one "seconds  name" line each in DF_PHASES: launch/test.sh prints them at the end.
DF_PHASES=()
df_start=$(date +%s)
df_phase_t0=$df_start
df_phase_done() {
  local now
  now=$(date +%s)
  DF_PHASES+=("$(printf '%9d  %s' $((now - df_phase_t0)) "$1")")
  df_phase_t0=$now
}

DF_PACKAGES=(build-essential cmake openmpi-bin libopenmpi-dev libhdf5-dev libtomlplusplus-dev libcli11-dev
             nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev libopenblas-dev libhwloc-dev hdf5-tools
             libpcre2-dev libunistring-dev python3-matplotlib iproute2
             clang libclang-rt-14-dev libomp-14-dev  # clang: the sanitizer + libFuzzer tree (tests/fuzz/build_san.sh)
             lld  # the linker of both trees when present (CMakeLists.txt)
             ninja-build)  # the generator of both trees (df_generator below)
missing=()
for p in "${DF_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
df_phase_done "setup (apt)"

# CUDA is compiled whenever nvcc exists (CI proves it builds even without a GPU).
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi

# Ninja for a new build tree: it schedules every target's compiles together (Make finishes the CUDA library before
# the first C++ file of the library that links it starts, and one target before the next that depends on it). A
# tree configured earlier keeps its generator (CMake refuses to change it).
df_generator() {
  if [ ! -f "$1/CMakeCache.txt" ] && command -v ninja >/dev/null; then echo "-G Ninja"; fi
}

# mpirun refuses root and more ranks than cores unless told; CI runs as root on 2 cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# The job count first: GNU nproc honours OMP_NUM_THREADS, so after the export below it would say 1.
jobs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# Line tables (-g1) instead of full debug information: file:line in every backtrace and the same machine code
# (-g never changes code generation), with objects a quarter the size, so every compile and every link of the
# test executables is faster (src/core/config.cpp: 9.0 s of CPU against 11.8 s, 0.8 MB against 3.7 MB).
cmake -S "$ROOT_DIR" -B "$BUILD_DIR" $(df_generator "$BUILD_DIR") -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" \
  >"$BUILD_DIR.configure.log" 2>&1 ||
  { cat "$BUILD_DIR.configure.log"; exit 1; }
grep -E "dflash_mpi:" "$BUILD_DIR.configure.log" || true
df_phase_done configure
# BUILD_TARGETS narrows the build (the demo needs only the binary); default: everything, tests included.
cmake --build "$BUILD_DIR" -j"$jobs" ${BUILD_TARGETS:+--target $BUILD_TARGETS}
df_phase_done build
