#!/usr/bin/env bash
# The test command: install what is missing, build, run every test (GPU tests skip themselves without one).
set -euo pipefail
source "$(dirname "$0")/setup.sh"
cd "$BUILD_DIR"
ctest --output-on-failure -j"$jobs" "$@"
