#!/usr/bin/env bash
# Runs the real binary for `topo discover|rankfile|nccl-xml` and `plan split|vram|flops` on the sysfs fixtures and
# checks exit codes, files and messages, including every refusal. Args: binary, source dir.
set -uo pipefail
BIN="$1"
SRC="$2"
FIX="$SRC/tests/fixtures/sysfs"
M27="$SRC/tests/fixtures/models/qwen3.6-27b"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
fails=0

fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
# run NAME CMD...: runs, keeps stdout/stderr in $TMP/NAME.{out,err} and the exit code in $rc.
run() {
  local name="$1"; shift
  "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
  rc=$?
}
expect_ok() { [ "$rc" -eq 0 ] || fail "$1: exit $rc: $(cat "$TMP/$1.err")"; }
expect_err() {  # NAME MESSAGE: non-zero exit and MESSAGE on stderr
  [ "$rc" -ne 0 ] || fail "$1: exit 0, expected failure"
  grep -qF -- "$2" "$TMP/$1.err" || fail "$1: stderr lacks '$2': $(cat "$TMP/$1.err")"
}
has() { grep -qF -- "$3" "$TMP/$1.$2" || fail "$1: $2 lacks '$3'"; }

# discover
run disc_bare "$BIN" topo discover --sysfs-root "$FIX/bare_4x4"
expect_ok disc_bare
has disc_bare out "gpu 7  0000:db:00.0  numa 1"
has disc_bare out "numa 1  cpus 32-63"
[ "$(grep -c '^  gpu ' "$TMP/disc_bare.out")" -eq 8 ] || fail "disc_bare: expected 8 GPUs"
[ -s "$TMP/disc_bare.err" ] && fail "disc_bare: unexpected warning: $(cat "$TMP/disc_bare.err")"

run disc_vm "$BIN" topo discover --sysfs-root "$FIX/vm_8" --json
expect_ok disc_vm
has disc_vm err "report numa_node -1"
python3 - "$TMP/disc_vm.out" <<'EOF' || fail "disc_vm: JSON content"
import json, sys
j = json.load(open(sys.argv[1]))
g = j["hosts"][0]["gpus"]
assert len(g) == 8 and all(x["numa"] == -1 and not x["numa_known"] for x in g), g
assert g[0]["bus_id"] == "0000:18:00.0" and g[0]["local_cpus"] == "0-63"
assert j["hosts"][0]["warnings"], "warning missing from JSON"
EOF

run disc_two "$BIN" topo discover --host "nodeA=$FIX/two_hosts/nodeA" --host "nodeB=$FIX/two_hosts/nodeB"
expect_ok disc_two
has disc_two out "host nodeA"
has disc_two out "host nodeB"

# The seed's PCIe-only box: PCIe 5.0 x16 links, NODE within a socket and SYS across, as nvidia-smi topo -m showed.
run disc_pcie "$BIN" topo discover --sysfs-root "$FIX/pcie_8x_2numa"
expect_ok disc_pcie
has disc_pcie out "8 GPUs, 2 NUMA nodes, NVLink unknown (sysfs: no NVSwitch seen)"
has disc_pcie out "PCIe 5.0 x16 (63.0 GB/s a direction)"
has disc_pcie out "   gpu0      X  NODE  NODE  NODE   SYS   SYS   SYS   SYS"
has disc_pcie out "   gpu7    SYS   SYS   SYS   SYS  NODE  NODE  NODE     X"
run disc_pcie_json "$BIN" topo discover --sysfs-root "$FIX/pcie_8x_2numa" --json
expect_ok disc_pcie_json
python3 - "$TMP/disc_pcie_json.out" <<'EOF' || fail "disc_pcie_json: JSON content"
import json, sys
h = json.load(open(sys.argv[1]))["hosts"][0]
assert h["nvlink"].startswith("unknown"), h["nvlink"]
for g in h["gpus"]:
    assert g["pcie_gts"] == 32 and g["pcie_width"] == 16 and g["nvlinks"] == -1, g
    assert abs(g["pcie_bytes_per_s"] - 32e9 * 128 / 130 * 16 / 8) < 1, g
EOF
has disc_bare out "NVLink present"
has disc_bare out "   gpu0      X    NV    NV"

run disc_missing "$BIN" topo discover --sysfs-root "$TMP/nothing"
expect_err disc_missing "$TMP/nothing/bus/pci/devices is not a directory"

# rankfile: 7-1 on 4+4, exact file
run rf71 "$BIN" topo rankfile --targets 7 --drafters 1 --sysfs-root "$FIX/bare_4x4" --hosts node01 --out "$TMP/71.rf"
expect_ok rf71
has rf71 out "launch: mpirun -np 8 --rankfile $TMP/71.rf"
cat >"$TMP/71.expected" <<'EOF'
# Open MPI rankfile from `dflash_mpi topo rankfile`: targets=7 drafters=1 hosts=1
# slot = cores of the node, each GPU bound to an equal share of its NUMA node's cores.
# index = target / drafter index: batch b goes to target b % T, then to drafter b % D.
rank 0=node01 slot=0-7  # role=target gpu=0 numa=0 index=0
rank 1=node01 slot=8-15  # role=target gpu=1 numa=0 index=1
rank 2=node01 slot=16-23  # role=target gpu=2 numa=0 index=2
rank 3=node01 slot=24-31  # role=target gpu=3 numa=0 index=3
rank 4=node01 slot=32-39  # role=target gpu=4 numa=1 index=4
rank 5=node01 slot=40-47  # role=target gpu=5 numa=1 index=5
rank 6=node01 slot=48-55  # role=target gpu=6 numa=1 index=6
rank 7=node01 slot=56-63  # role=drafter gpu=7 numa=1 index=0
EOF
diff "$TMP/71.expected" "$TMP/71.rf" >/dev/null || fail "rf71: file differs: $(diff "$TMP/71.expected" "$TMP/71.rf")"

run rf_two "$BIN" topo rankfile --targets 6 --drafters 2 --host "nodeA=$FIX/two_hosts/nodeA" --host "nodeB=$FIX/two_hosts/nodeB"
expect_ok rf_two
has rf_two out "rank 3=nodeA slot=24-31  # role=drafter gpu=3 numa=1 index=0"
has rf_two out "rank 7=nodeB slot=12-15  # role=drafter gpu=3 numa=1 index=1"
has rf_two err "0 of 6 target->drafter pairs cross hosts: 0.0% of the feature bytes"

# rf_27b NAME T D: T + D on two 8-GPU hosts, with the 27B batch size and the planner's rates for the GB/s.
rf_27b() {
  run "$1" "$BIN" topo rankfile --targets "$2" --drafters "$3" --sysfs-root "$FIX/bare_4x4" --hosts 'node[01-02]' \
    --config "$SRC/configs/qwen3.6-27b.toml" --target-config "$SRC/tests/fixtures/models/qwen3.6-27b" \
    --target-rate 0.25 --drafter-rate 0.5 --out "$TMP/$1.rf"
  expect_ok "$1"
}
# Traffic-aware placement: 8 targets + 4 drafters on two 8-GPU hosts keep every batch on its host (4 T + 2 D
# each, drafters on NUMA 1), and at the planner's rates the features of one 27B batch (1.678 GB) never cross.
rf_27b rf84 8 4
has rf84 out "0 of 8 target->drafter pairs cross hosts: 0.0% of the feature bytes"
has rf84 out "at 2 batches/s x 1.678e+09 B per batch: 0 GB/s across hosts (3.356 GB/s of features in all)"
[ "$(grep -c 'role=drafter gpu=[67] numa=1' "$TMP/rf84.rf")" -eq 4 ] || fail "rf84: drafters not on GPUs 6-7 of NUMA 1"
# Counts whose groups fit no host whole say so, with the share, the bytes and a count that would fit.
rf_27b rf123 12 3
has rf123 err "so 16.7% of the feature traffic crosses hosts; HINT: --targets 12 --drafters 2 keeps every batch"
has rf123 out "at 1.5 batches/s x 1.678e+09 B per batch: 0.4195 GB/s across hosts"
# 7-1 on the PCIe box at the 27B batch: 4 of 7 targets send over SYS, and the drafter's link carries the stream.
run rf_pcie "$BIN" topo rankfile --targets 7 --drafters 1 --sysfs-root "$FIX/pcie_8x_2numa" --hosts seed \
  --config "$SRC/configs/qwen3.6-27b.toml" --target-config "$M27" --target-rate 0.1 --drafter-rate 0.5
expect_ok rf_pcie
has rf_pcie out "rank 7=seed slot=56-63  # role=drafter gpu=7 numa=1 index=0"
has rf_pcie err "paths on a host: 0 NVLink, 3 NODE (PCIe within a NUMA node), 4 SYS"
has rf_pcie err "pipeline 0.5 batches/s with the PCIe 5.0 x16 links' cost"
has rf_pcie err "each drafter receives 0.8389 GB/s of features: 1.3% of its PCIe 5.0 x16 link (63.0 GB/s"
run rf_rates "$BIN" topo rankfile --targets 7 --drafters 1 --sysfs-root "$FIX/bare_4x4" --target-rate 1
expect_err rf_rates "--target-rate and --drafter-rate go together with --config"

run rf_hosts "$BIN" topo rankfile --targets 14 --drafters 2 --sysfs-root "$FIX/bare_4x4" --hosts 'node[01-02]'
expect_ok rf_hosts
has rf_hosts out "rank 15=node02 slot=56-63  # role=drafter gpu=7 numa=1"
[ "$(grep -c '^rank ' "$TMP/rf_hosts.out")" -eq 16 ] || fail "rf_hosts: expected 16 ranks"

run rf_slurm env SLURM_JOB_NODELIST='gpu[1-2]' "$BIN" topo rankfile --targets 9 --drafters 2 --sysfs-root "$FIX/bare_4x4" --slurm
expect_ok rf_slurm
has rf_slurm out "rank 7=gpu1 slot=56-63  # role=drafter gpu=7 numa=1"
has rf_slurm out "rank 10=gpu2 slot=56-63  # role=drafter gpu=7 numa=1"

run rf_vm "$BIN" topo rankfile --targets 7 --drafters 1 --sysfs-root "$FIX/vm_8" --hosts vm1
expect_ok rf_vm
has rf_vm out "rank 7=vm1 slot=56-63  # role=drafter gpu=7 numa=-1"
has rf_vm err "numa_node -1"

run rf_too_many "$BIN" topo rankfile --targets 8 --drafters 1 --sysfs-root "$FIX/bare_4x4" --hosts node01
expect_err rf_too_many "9 ranks but only 8 GPUs"
run rf_no_drafter "$BIN" topo rankfile --targets 7 --drafters 0 --sysfs-root "$FIX/bare_4x4"
expect_err rf_no_drafter "at least one drafter"
run rf_no_target "$BIN" topo rankfile --targets 0 --drafters 1 --sysfs-root "$FIX/bare_4x4"
expect_err rf_no_target "at least one target"
run rf_no_slurm env -u SLURM_JOB_NODELIST -u SLURM_NODELIST "$BIN" topo rankfile --targets 1 --drafters 1 --sysfs-root "$FIX/bare_4x4" --slurm
expect_err rf_no_slurm "SLURM_JOB_NODELIST is not set"
run rf_both "$BIN" topo rankfile --targets 1 --drafters 1 --sysfs-root "$FIX/bare_4x4" --hosts a --slurm
expect_err rf_both "--hosts and --slurm both"
run rf_badhost "$BIN" topo rankfile --targets 1 --drafters 1 --host nodeA
expect_err rf_badhost "--host 'nodeA' is not NAME=DIR"
run rf_noargs "$BIN" topo rankfile --drafters 1
[ "$rc" -ne 0 ] || fail "rf_noargs: missing --targets accepted"

# nccl-xml
run nx "$BIN" topo nccl-xml --numa 0-3:1,4-7:0 --sysfs-root "$FIX/vm_8" --out "$TMP/topo.xml"
expect_ok nx
[ "$(cat "$TMP/nx.out")" = "export NCCL_TOPO_FILE=$TMP/topo.xml" ] || fail "nx: stdout is '$(cat "$TMP/nx.out")'"
python3 - "$TMP/topo.xml" <<'EOF' || fail "nx: XML content"
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
assert root.tag == "system" and root.get("version") == "1"
where = {p.get("busid"): c.get("numaid") for c in root.findall("cpu") for p in c.findall("pci")}
assert where["0000:18:00.0"] == "1" and where["0000:db:00.0"] == "0" and len(where) == 8, where
assert all(p.get("class") == "0x030200" for p in root.iter("pci"))
EOF
run nx_gap "$BIN" topo nccl-xml --numa 0-3:1 --sysfs-root "$FIX/vm_8" --out "$TMP/gap.xml"
expect_err nx_gap "leaves GPU 4"
run nx_noout "$BIN" topo nccl-xml --numa 0-7:0 --sysfs-root "$FIX/vm_8"
[ "$rc" -ne 0 ] || fail "nx_noout: missing --out accepted"
run nx_baddir "$BIN" topo nccl-xml --sysfs-root "$FIX/bare_4x4" --out "$TMP/no/such/dir/t.xml"
expect_err nx_baddir "cannot write"

# plan split
run split "$BIN" plan split --target-rate 0.1314285714 --drafter-rate 0.86 --gpus 8 --unit batches/s
expect_ok split
has split out "recommendation: 7-1"
[ "$(grep -c '^[0-9]-[0-9] ' "$TMP/split.out")" -eq 7 ] || fail "split: expected 7 table rows"
run split_tok "$BIN" plan split --target-rate 1000 --drafter-rate 3000 --gpus 5 --unit tok/s
expect_ok split_tok
has split_tok out "recommendation: 4-1 (4 targets, 1 drafter): 3000.0000 tok/s"
run split_one "$BIN" plan split --target-rate 1 --drafter-rate 1 --gpus 1
expect_err split_one "--gpus 1"
run split_neg "$BIN" plan split --target-rate -1 --drafter-rate 1 --gpus 4
expect_err split_neg "--target-rate"
run split_unit "$BIN" plan split --target-rate 1 --drafter-rate 1 --gpus 4 --unit furlongs
[ "$rc" -ne 0 ] || fail "split_unit: bad --unit accepted"
# With PCIe links the 27B recipe's 6.9 GB of fp32 gradients cost 0.138 s a step for two drafters at 50 GB/s.
run split_link "$BIN" plan split --target-rate 0.1 --drafter-rate 0.5 --gpus 8 --link-gbps 50 \
  --link-name "PCIe 5.0 x16" --config "$SRC/configs/qwen3.6-27b.toml" --target-config "$M27"
expect_ok split_link
has split_link out "links: PCIe 5.0 x16 at 50 GB/s a GPU and direction; 1.678 GB a batch (feature stream), 6.921 GB"
has split_link out "0.138 s/step"
run split_link_json "$BIN" plan split --json --target-rate 0.1 --drafter-rate 0.5 --gpus 8 --link-gbps 50 \
  --config "$SRC/configs/qwen3.6-27b.toml" --target-config "$M27"
expect_ok split_link_json
python3 - "$TMP/split_link_json.out" <<'EOF' || fail "split_link_json: JSON content"
import json, sys
j = json.load(open(sys.argv[1]))
r = {x["drafters"]: x for x in j["rows"]}
assert r[1]["allreduce_bytes"] == 0 and abs(r[2]["allreduce_bytes"] - j["grad_bytes"]) < 1, r[2]
assert abs(r[2]["drafter_rate"] - 1 / (2 + j["grad_bytes"] / 50e9)) < 1e-12, r[2]
EOF
run split_link_noconfig "$BIN" plan split --target-rate 1 --drafter-rate 1 --gpus 4 --link-gbps 50
expect_err split_link_noconfig "--link-gbps needs --config"
run split_link_tok "$BIN" plan split --target-rate 1 --drafter-rate 1 --gpus 4 --link-gbps 50 --unit tok/s \
  --config "$SRC/configs/qwen3.6-27b.toml" --target-config "$M27"
expect_err split_link_tok "--link-gbps needs rates in batches/s"

# plan flops: the 27B recipe's batch as 8 sequences of 4096
run flops "$BIN" plan flops --config "$SRC/configs/qwen3.6-27b.toml" --target-config "$M27" --seq-len 4096
expect_ok flops
has flops out "batch: 32768 tokens as 8 sequence(s) of 4096"
has flops out "4096 anchor blocks sampled, 512 kept)"
run flops_nomodel "$BIN" plan flops --config "$SRC/configs/qwen3-8b.toml"
expect_err flops_nomodel "/models/Qwen3-8B"

# plan vram: the 27B recipe fits 80 GiB and the seed's 96 GB cards, not 40 GiB; a missing target config is named
run vram_96 "$BIN" plan vram --config "$SRC/configs/qwen3.6-27b.toml" --target-config "$M27" --gpu-mem 96
expect_ok vram_96
has vram_96 out "verdict: fits (target 56.28 GiB, drafter 48.90 GiB, GPU 96.00 GiB)"
run vram_ok "$BIN" plan vram --config "$SRC/configs/qwen3.6-27b.toml" --target-config "$M27" --gpu-mem 80
expect_ok vram_ok
has vram_ok out "verdict: fits (target 56.28 GiB, drafter 48.90 GiB, GPU 80.00 GiB)"
has vram_ok out "drafter: 1730213120 trainable params"
run vram_small "$BIN" plan vram --config "$SRC/configs/qwen3.6-27b.toml" --target-config "$M27" --gpu-mem 40
expect_err vram_small "does not fit a 40.00 GiB GPU (--gpu-mem): target needs 56.28 GiB"
has vram_small out "verdict: DOES NOT FIT"
run vram_8b "$BIN" plan vram --config "$SRC/configs/qwen3-8b.toml" \
  --target-config "$SRC/tests/fixtures/models/qwen3-8b" --gpu-mem 80
expect_ok vram_8b
run vram_nomodel "$BIN" plan vram --config "$SRC/configs/qwen3-8b.toml" --gpu-mem 80
expect_err vram_nomodel "/models/Qwen3-8B"

if [ "$fails" -ne 0 ]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "all topo CLI checks passed"
