# Two hosts on one machine for the multi-host tests: network namespaces h1 and h2 joined by a veth pair,
# each with its own hostname (UTS namespace) and /etc/hosts (/etc/netns/NS/hosts, which `ip netns exec`
# mounts), and an rsh agent through which mpirun, started inside h1, launches its daemon inside h2.
# Sourced with BIN, SRC, MPIEXEC set. Exits 77 (ctest: skipped) where namespaces cannot be made.
set -uo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
NS1=dfmh$$a NS2=dfmh$$b VETH1=dfv$$a VETH2=dfv$$b
SUBNET=10.231.0.0/24
TMP=$(mktemp -d)
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# Everything this test started lives in its two namespaces: killing their processes and deleting them
# cleans up after a failure too.
netns_cleanup() {
  for ns in "$NS1" "$NS2"; do
    if ip netns list 2>/dev/null | grep -qw "$ns"; then
      for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
      ip netns del "$ns" 2>/dev/null
    fi
    rm -rf "/etc/netns/$ns"
  done
  rmdir /etc/netns 2>/dev/null  # only when no other namespace keeps files there
  ip link del "$VETH1" 2>/dev/null
  rm -rf "$TMP"
}
trap netns_cleanup EXIT

skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "two namespace hosts need root (ip netns add needs CAP_SYS_ADMIN)"
for c in ip unshare; do command -v $c >/dev/null || skip "'$c' is missing (apt-get install iproute2 util-linux)"; done
ip netns add "$NS1" 2>"$TMP/netns.err" ||
  skip "ip netns add failed: $(cat "$TMP/netns.err") (needs CAP_SYS_ADMIN; containers without it cannot make hosts)"
ip netns add "$NS2" && ip link add "$VETH1" type veth peer name "$VETH2" &&
  ip link set "$VETH1" netns "$NS1" && ip link set "$VETH2" netns "$NS2" &&
  ip -n "$NS1" addr add 10.231.0.1/24 dev "$VETH1" && ip -n "$NS2" addr add 10.231.0.2/24 dev "$VETH2" &&
  ip -n "$NS1" link set lo up && ip -n "$NS2" link set lo up &&
  ip -n "$NS1" link set "$VETH1" up && ip -n "$NS2" link set "$VETH2" up ||
  skip "could not join the namespaces by a veth pair (no veth support here?)"
ip netns exec "$NS2" unshare --uts /bin/bash -c 'hostname h2' 2>"$TMP/uts.err" ||
  skip "cannot give a namespace host its own name: $(cat "$TMP/uts.err")"
for ns in "$NS1" "$NS2"; do
  mkdir -p "/etc/netns/$ns"
  printf '127.0.0.1 localhost\n10.231.0.1 h1\n10.231.0.2 h2\n' >"/etc/netns/$ns/hosts"
done

# Open MPI calls the agent like ssh: [options] HOST COMMAND...; the command runs in HOST's namespace.
cat >"$TMP/agent.sh" <<AGENT
#!/bin/bash
while [ \$# -gt 0 ]; do case "\$1" in -*) shift ;; *) break ;; esac; done
host=\$1; shift
case "\$host" in h1) ns=$NS1 ;; h2) ns=$NS2 ;; *) echo "agent: unknown host \$host" >&2; exit 255 ;; esac
exec ip netns exec "\$ns" unshare --uts /bin/bash -c "hostname \$host; \$*"
AGENT
chmod +x "$TMP/agent.sh"

# mh_mpirun ARGS...: mpirun inside h1 (as host h1), with h2 reachable only over the veth; killed after 300 s.
mh_mpirun() {
  ip netns exec "$NS1" unshare --uts /bin/bash -c 'hostname h1; exec "$@"' _ timeout 300 "$MPIEXEC" --oversubscribe \
    --mca plm_rsh_agent "$TMP/agent.sh" --mca btl tcp,self,vader --mca btl_tcp_if_include "$SUBNET" \
    --mca oob_tcp_if_include "$SUBNET" "$@"
}

# A sysfs tree for a host with 2 GPUs on one NUMA node holding this machine's cores, so the rankfile's
# slots bind to cores that exist here.
mkdir -p "$TMP/sysfs/devices/system/node/node0" "$TMP/sysfs/devices/system/cpu"
echo "0-$(($(nproc) - 1))" | tee "$TMP/sysfs/devices/system/node/node0/cpulist" >"$TMP/sysfs/devices/system/cpu/online"
for bdf in 0000:1b:00.0 0000:43:00.0; do
  d="$TMP/sysfs/bus/pci/devices/$bdf"
  mkdir -p "$d" && echo 0x10de >"$d/vendor" && echo 0x030200 >"$d/class" && echo 0 >"$d/numa_node" &&
    cat "$TMP/sysfs/devices/system/node/node0/cpulist" >"$d/local_cpulist"
done

"$BIN" data synth --out "$TMP/tokens.h5" --vocab 255 --sequences 400 --min-len 24 --max-len 96 --seed 3 >/dev/null ||
  { echo "FAIL: data synth"; exit 1; }
source "$SRC/tests/mpi/tiny_config.sh"
# losses FILE: the "loss" of every line of a metrics.jsonl, one per line, full precision.
