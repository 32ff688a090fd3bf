#!/usr/bin/env bash
# Our non-GEMM prefill kernels beside their peers, in the same GPU call: `bench_kernels attention` and
# `bench_kernels gdn` (each checks its result against CpuOps first), then benchmarks/peer_kernels.py (torch's
# cuDNN and FlashAttention-2 SDPA, FLA's chunk_gated_delta_rule) on the same shapes, then one line per row:
# our ms, the peer's ms, and peer / ours (above 1: ours is faster). GPU machine only.
#
#   benchmarks/run_kernels_peer.sh [BUILD_DIR]       (default: build)
# Environment: DF_FLA the FLA tree (default .peer/flash-linear-attention), PYTHON (python3),
# DF_BENCH_TIMEOUT seconds per program (default 240). Logs go to $BUILD_DIR/kernels_peer/.
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$here/build}"
python="${PYTHON:-python3}"
timeout_s="${DF_BENCH_TIMEOUT:-240}"
fla="${DF_FLA:-$here/.peer/flash-linear-attention}"
bench="$build/benchmarks/bench_kernels"
die() { echo "run_kernels_peer: $*" >&2; exit 2; }
[[ -x "$bench" ]] || die "$bench not built. HINT: cmake --build $build -j --target bench_kernels"
[[ -f "$fla/fla/__init__.py" ]] || die "no flash-linear-attention tree at $fla. HINT: carry .peer/ (benchmarks/hf_peer.py names the commit) or set DF_FLA"
logs="$build/kernels_peer"
mkdir -p "$logs"
rc=0
for what in attention gdn; do
  timeout "$timeout_s" "$bench" "$what" >"$logs/ours-$what.log" 2>&1 || { echo "bench_kernels $what: FAILED (rc $?)"; rc=1; }
  cat "$logs/ours-$what.log"
done
timeout "$timeout_s" "$python" "$here/benchmarks/peer_kernels.py" all --fla "$fla" >"$logs/peer.log" 2>&1 ||
  { echo "peer_kernels.py: FAILED (rc $?)"; rc=1; }
cat "$logs/peer.log"
"$python" - "$logs" <<'PY' || rc=1
import json, re, sys
logs = sys.argv[1]
ours = {}
for what in ("attention", "gdn"):
    for line in open(f"{logs}/ours-{what}.log"):
        m = re.match(r"(\S.*?)\s+[\d.]+ (?:GFLOP|MB)\s+([\d.]+) ms", line)
        if m:
            ours.setdefault(m.group(1).strip(), float(m.group(2)))
peer = {}
for line in open(f"{logs}/peer.log"):
    if line.startswith("{"):
        r = json.loads(line)
        if "ms" in r:
            peer.setdefault((r["row"], r["backend"]), r["ms"])
# Our six attention launches (bench_kernels names them; the default is [tiles, dynamic]) against
# cuDNN, the default against the gated cuDNN row and FA2.
tags = ["[heads first, persistent]", "[tiles, persistent]", "[heads first, one CTA an item]",
        "[tiles, one CTA an item]", "[heads first, dynamic]", "[tiles, dynamic]"]
a256, a128 = "attention causal 24/4 hd256 gated", "attention causal 32/8 hd128"
d256, d128 = f"{a256} [tiles, dynamic]", f"{a128} [tiles, dynamic]"
pairs = [(d256, ("attention 24/4 hd256 gated + gate", "cudnn"))]
pairs += [(f"{a256} {t}", ("attention 24/4 hd256 gated", "cudnn")) for t in tags]
pairs += [(f"{a128} {t}", ("attention 32/8 hd128", "cudnn")) for t in tags]
pairs += [(d256, ("attention 24/4 hd256 gated + gate", "flash")), (d128, ("attention 32/8 hd128", "flash")),
          ("gdn_prefill 16/48 dk=dv=128 (bf16 mma)", ("gdn_prefill 16/48 128", "fla chunk_gated_delta_rule"))]
print("\nsame call, cold (ours: bench_kernels; peer: peer_kernels.py); ratio = peer ms / our ms")
for o, (p, backend) in pairs:
    if o in ours and (p, backend) in peer:
        print(f"  {o:<64} ours {ours[o]:8.3f} ms | {backend} '{p}' {peer[(p, backend)]:8.3f} ms | "
              f"ratio {peer[(p, backend)] / ours[o]:.2f}")
    else:
        print(f"  {o:<64} missing: ours {o in ours}, peer {(p, backend) in peer}")
PY
exit $rc
