#!/usr/bin/env bash
# Shared set-up for demo.sh and test.sh: installs the Debian packages that are missing (idempotent),
# configures and builds into build/. Sourced, not executed; leaves BUILD_DIR set.
set -euo pipefail
ROOT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT_DIR/build}

DF_PACKAGES=(build-essential cmake openmpi-bin libopenmpi-dev libhdf5-dev libtomlplusplus-dev libcli11-dev
             nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev libopenblas-dev libhwloc-dev hdf5-tools
             libpcre2-dev libunistring-dev python3-matplotlib iproute2
             clang libclang-rt-14-dev libomp-14-dev)  # clang: the sanitizer + libFuzzer tree (tests/fuzz/build_san.sh)
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

# CUDA is compiled whenever nvcc exists (CI proves it builds even without a GPU).
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi

# mpirun refuses root and more ranks than cores unless told; CI runs as root on 2 cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# The job count first: GNU nproc honours OMP_NUM_THREADS, so after the export below it would say 1.
jobs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
cmake -S "$ROOT_DIR" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$BUILD_DIR.configure.log" 2>&1 ||
  { cat "$BUILD_DIR.configure.log"; exit 1; }
grep -E "dflash_mpi:" "$BUILD_DIR.configure.log" || true
# BUILD_TARGETS narrows the build (the demo needs only the binary); default: everything, tests included.
cmake --build "$BUILD_DIR" -j"$jobs" ${BUILD_TARGETS:+--target $BUILD_TARGETS}
