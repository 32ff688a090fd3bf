#!/usr/bin/env bash
# Two namespace hosts act as two machines for Open MPI: `topo rankfile --host` writes the rankfile mpirun
# places by; every rank's start-up line shows the host, local rank and role the file gave it; a CPU run with
# a target and a drafter on each host (the 2 drafters all-reduce across the veth) trains and checkpoints into
# one run dir; and the checkpoint resumes on one host with the same drafter count and the same losses.
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
source "$SRC/tests/multihost/netns_hosts.sh"

# 1. The rankfile: one target + one drafter per host, each target feeding the drafter beside it.
"$BIN" topo rankfile --host "h1=$TMP/sysfs" --host "h2=$TMP/sysfs" --targets 2 --drafters 2 --out "$TMP/rf" \
  >"$TMP/rf.out" 2>&1 || { fail "topo rankfile: $(cat "$TMP/rf.out")"; exit 1; }
grep -q "0 of 2 target->drafter pairs cross hosts: 0.0% of the feature bytes" "$TMP/rf.out" ||
  fail "rankfile traffic line: $(cat "$TMP/rf.out")"
want="0 h1 target 0
1 h1 drafter 0
2 h2 target 1
3 h2 drafter 1"
got=$(sed -n 's/^rank \([0-9]*\)=\([^ ]*\) .*role=\([a-z]*\) .*index=\([0-9]*\).*/\1 \2 \3 \4/p' "$TMP/rf")
[ "$got" == "$want" ] && echo "ok: rankfile places target+drafter on each host: $(echo $got)" ||
  fail "rankfile: got [$got], want [$want]"

# 2. Train 6 steps across both hosts (checkpoints at 3 and 6), roles from the rankfile mpirun was given.
tiny_config "$TMP/two.toml" "$TMP/two" "$TMP/tokens.h5" 2 2 6
sed -i 's/^interval = 1000$/interval = 3/' "$TMP/two.toml"
mh_mpirun -np 4 --rankfile "$TMP/rf" "$BIN" --config "$TMP/two.toml" >"$TMP/two.log" 2>&1
rc=$?
[ $rc -eq 0 ] || { fail "two-host run exited $rc"; tail -30 "$TMP/two.log"; }
# Start-up line of rank R: host, local rank / ranks on the host, role and index, as the rankfile says; rank 0
# says once where the roles came from.
grep -q "2 targets, 2 drafters (roles from OMPI_MCA_orte_rankfile" "$TMP/two.log" ||
  fail "rank 0 does not say the roles came from the rankfile: $(grep -m1 "roles from" "$TMP/two.log")"
while read -r r h role idx; do
  local_rank=$((r % 2))
  grep -qE "^\[rank $r $h\] pid [0-9]+ host $h local $local_rank/2 role $role$idx " "$TMP/two.log" ||
    fail "rank $r: want host $h local $local_rank/2 role $role$idx: $(grep "^\[rank $r " "$TMP/two.log")"
done <<<"$want"
grep -q "roles by host: h1 \[ranks 0=target0 1=drafter0\]; h2 \[ranks 2=target1 3=drafter1\]" "$TMP/two.log" ||
  fail "no roles-by-host table on rank 0"
[ "$(step_lines "$TMP/two/metrics.jsonl" 2>/dev/null)" == 6 ] || fail "two-host run: expected 6 metrics lines"
for s in 3 6; do [ -f "$TMP/two/checkpoints/step_0000000$s.h5" ] || fail "two-host run: no checkpoint of step $s"; done
[ $fails -eq 0 ] && echo "ok: 2 hosts trained 6 steps, checkpoints 3 and 6 in the shared run dir" \
  "($(losses "$TMP/two/metrics.jsonl" | tr '\n' ' '))"

# 3. Resume step 3 on one host (no namespaces, roles from [topology]): the same 2 drafters, the same losses.
cp -r "$TMP/two" "$TMP/one"
rm -f "$TMP/one/checkpoints/step_00000006.h5" && echo "step_00000003.h5" >"$TMP/one/checkpoints/latest"
# The metrics up to step 3 (its start marker and 3 metric lines), as a run stopped there would have left them.
awk '/"loss"/ { n++ } { print } n == 3 { exit }' "$TMP/two/metrics.jsonl" >"$TMP/one/metrics.jsonl"
tiny_config "$TMP/one.toml" "$TMP/one" "$TMP/tokens.h5" 2 2 6
timeout 300 "$MPIEXEC" --oversubscribe -np 4 "$BIN" --config "$TMP/one.toml" >"$TMP/one.log" 2>&1 ||
  { fail "one-host resume"; tail -30 "$TMP/one.log"; }
grep -q "resumed from .*step_00000003.h5 at step 3" "$TMP/one.log" || fail "one-host run did not resume at step 3"
if [ "$(losses "$TMP/two/metrics.jsonl")" == "$(losses "$TMP/one/metrics.jsonl")" ]; then
  echo "ok: resumed on one host at step 3: steps 4-6 have the two-host losses"
else
  fail "one-host resume changed the losses"; paste <(losses "$TMP/two/metrics.jsonl") <(losses "$TMP/one/metrics.jsonl")
fi
echo "$fails failed"
[ "$fails" -eq 0 ]
