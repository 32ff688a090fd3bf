// MPI bootstrap and role resolution. The rankfile parser lives in topo/ (it also writes rankfiles); here
// the roles are checked against the world the launcher actually started, because a wrong launcher silently
// starts N singletons and a mismatched rankfile would pair the wrong ranks.
#include "comm/dist.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <map>

#include "core/count_noun.h"
#include "core/error.h"
#include "core/log.h"
#ifdef DF_HAVE_CUDA
#include "comm/nccl_comm.h"
#include "comm/watchdog.h"
#include "ops/cuda/cuda_ops.h"
#endif
#include "comm/host_watch.h"

namespace df {

namespace {

std::atomic<int> g_stop_signal{0};  // the signal that asked to stop, kStopFileSeen, or 0
constexpr int kStopFileSeen = -1;
std::string g_stop_file;  // DFLASH_STOP_FILE: its existence asks to stop as SIGUSR1 does

extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

RoleMap roles_from_rankfile(const std::string& path, const std::string& source,
                            const std::vector<std::string>& hosts) {
  const int world = int(hosts.size());
  std::vector<RankfileEntry> entries = rankfile_parse(path);
  DF_CHECK(int(entries.size()) == world,
           "%s names %zu ranks but %d were started; HINT: run mpirun -np %zu with this rankfile, or write a new one "
           "with `dflash_mpi topo rankfile`",
           source.c_str(), entries.size(), world, entries.size());
  RoleMap m;
  m.source = source;
  m.role.resize(world);
  m.gpu.resize(world);
  m.numa.assign(size_t(world), -1);
  m.pinned.assign(size_t(world), false);
  for (const RankfileEntry& e : entries) {
    m.role[e.rank] = e.role;
    m.gpu[e.rank] = e.gpu;
    m.numa[size_t(e.rank)] = e.numa;
    m.pinned[size_t(e.rank)] = e.pinned;
    // A launcher that places ranks by its own rule (srun's block distribution, a hand-made host list) can
    // disagree with the file; then the gpu= and index= placement the file was written for does not hold.
    if (e.host != hosts[e.rank] && m.host_mismatch.empty())
      m.host_mismatch = strfmt("%s puts rank %d on %s but it runs on %s", source.c_str(), e.rank,
                               e.host.c_str(), hosts[e.rank].c_str());
  }
  m.targets = rankfile_role_ranks(entries, RankRole::target);
  m.drafters = rankfile_role_ranks(entries, RankRole::drafter);
  return m;
}

std::string cpu_affinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return "?";
  std::string out;
  int n = CPU_SETSIZE, i = 0;
  while (i < n) {
    if (!CPU_ISSET(i, &set)) {
      ++i;
      continue;
    }
    int j = i;
    while (j + 1 < n && CPU_ISSET(j + 1, &set)) ++j;
    out += (out.empty() ? "" : ",") + (i == j ? std::to_string(i) : std::to_string(i) + "-" + std::to_string(j));
    i = j + 1;
  }
  return out;
}

}  // namespace

std::string roles_label(const RoleMap& m, int rank) {
  const std::vector<int>& same = m.role[rank] == RankRole::target ? m.targets : m.drafters;
  const auto it = std::find(same.begin(), same.end(), rank);
  return strfmt("%d=%s%d", rank, rank_role_name(m.role[rank]), int(it - same.begin()));
}

std::string roles_by_host(const RoleMap& m) {
  std::map<std::string, std::string> per_host;
  std::vector<std::string> order;
  for (size_t r = 0; r < m.hosts.size(); ++r) {
    std::string& line = per_host[m.hosts[r]];
    if (line.empty()) order.push_back(m.hosts[r]);
    line += (line.empty() ? "" : " ") + roles_label(m, int(r));
  }
  std::string out;
  for (const std::string& h : order)
    out += strfmt("%s%s [ranks %s]", out.empty() ? "" : "; ", h.c_str(), per_host[h].c_str());
  return out;
}

RoleMap roles_resolve(const std::string& rankfile_cli, const TopologySection& topo,
                      const std::vector<std::string>& hosts) {
  const int world = int(hosts.size());
  RoleMap m;
  std::string rf = rankfile_cli;
  std::string source = "--rankfile " + rf;
  // DFLASH_RANKFILE=none turns rankfiles off (roles from [topology]); launch scripts need a way to say so
  // that survives SLURM's SLURM_EXPORT_ENV re-export into srun tasks.
  const char* env_rf = std::getenv("DFLASH_RANKFILE");
  const bool no_rankfile = rf.empty() && env_rf && std::string(env_rf) == "none";
  if (rf.empty() && env_rf && !no_rankfile) {
    rf = env_rf;
    source = "DFLASH_RANKFILE=" + rf;
  }
  if (rf.empty() && !no_rankfile && std::getenv("OMPI_MCA_orte_rankfile")) {
    rf = std::getenv("OMPI_MCA_orte_rankfile");
    source = "OMPI_MCA_orte_rankfile=" + rf;
  }
  if (topo.offline) {
    // Offline training: the taps come from feature files, so every rank is a drafter.
    m.source = "data.features (offline: every rank a drafter)";
    m.role.assign(size_t(world), RankRole::drafter);
    m.gpu.assign(size_t(world), -1);
    if (!rf.empty()) {
      RoleMap from_file = roles_from_rankfile(rf, source, hosts);
      DF_CHECK(std::count(from_file.role.begin(), from_file.role.end(), RankRole::target) == 0,
               "%s names target ranks, but data.features makes this an offline run without targets; HINT: drop "
               "the role=target lines or data.features", source.c_str());
      m.gpu = from_file.gpu;
    }
  } else if (!rf.empty()) {
    m = roles_from_rankfile(rf, source, hosts);
  } else if (topo.targets > 0 || topo.drafters > 0) {
    DF_CHECK(topo.targets + topo.drafters == world,
             "[topology] asks for %s + %s = %d ranks but %d were started; HINT: mpirun -np %d",
             count_noun(topo.targets, "target").c_str(), count_noun(topo.drafters, "drafter").c_str(),
             topo.targets + topo.drafters, world, topo.targets + topo.drafters);
    m.source = "[topology]";
    for (int r = 0; r < world; ++r) m.role.push_back(r < topo.targets ? RankRole::target : RankRole::drafter);
    m.gpu.assign(world, -1);
  } else {
    m.source = "default (one drafter per host, its last rank)";
    std::map<std::string, int> last;
    for (int r = 0; r < world; ++r) last[hosts[r]] = r;
    for (int r = 0; r < world; ++r) m.role.push_back(last[hosts[r]] == r ? RankRole::drafter : RankRole::target);
    m.gpu.assign(world, -1);
  }
  m.hosts = hosts;
  m.numa.resize(size_t(world), -1);
  m.pinned.resize(size_t(world), false);
  if (m.targets.empty() && m.drafters.empty())
    for (int r = 0; r < world; ++r) (m.role[r] == RankRole::target ? m.targets : m.drafters).push_back(r);
  DF_CHECK(topo.offline || !m.targets.empty(), "roles from %s: no target rank among %d; HINT: a run needs at least one target and "
           "one drafter (e.g. mpirun -np 2 with [topology] targets = 1, drafters = 1)",
           m.source.c_str(), world);
  DF_CHECK(!m.drafters.empty(), "roles from %s: no drafter rank among %d; HINT: a run needs at least one target and "
           "one drafter",
           m.source.c_str(), world);
  return m;
}

void roles_pin(RoleMap& m, const std::vector<int>& ranks) {
  for (int r : ranks) {
    DF_CHECK(r >= 0 && r < int(m.role.size()), "'pipeline.rebalance_pinned' names rank %d but the job has ranks "
             "0..%zu; HINT: list world ranks of this job", r, m.role.size() - 1);
    m.pinned[size_t(r)] = true;
  }
}

std::vector<RoleSlot> roles_slots(const RoleMap& m, const std::vector<int>& gpus) {
  std::vector<RoleSlot> out(m.role.size());
  for (size_t r = 0; r < out.size(); ++r)
    out[r] = RoleSlot{m.role[r], m.hosts[r], m.numa[r], r < gpus.size() ? gpus[r] : -1, bool(m.pinned[r])};
  return out;
}

RoleMap roles_after_move(const RoleMap& m, const std::vector<int>& moved) {
  RoleMap n = m;
  auto drop = [](std::vector<int>& v, int r) { v.erase(std::remove(v.begin(), v.end(), r), v.end()); };
  for (int r : moved) {
    const bool to_drafter = n.role[size_t(r)] == RankRole::target;
    n.role[size_t(r)] = to_drafter ? RankRole::drafter : RankRole::target;
    drop(to_drafter ? n.targets : n.drafters, r);
    (to_drafter ? n.drafters : n.targets).push_back(r);
  }
  return n;
}

namespace {

// The rank's position among the targets or the drafters of c.roles (-1 for the role it does not have).
void set_role_indices(DistContext& c) {
  c.target_index = c.drafter_index = -1;
  for (size_t i = 0; i < c.roles.targets.size(); ++i)
    if (c.roles.targets[i] == c.rank) c.target_index = int(i);
  for (size_t i = 0; i < c.roles.drafters.size(); ++i)
    if (c.roles.drafters[i] == c.rank) c.drafter_index = int(i);
}

}  // namespace

DistContext dist_init(const std::string& rankfile_cli, const TopologySection& topo, bool use_gpus,
                      const std::string& transport, bool silence_watch) {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  process_info_init_from_mpi();
  DistContext c;
  c.rank = process_info().rank;
  c.world = process_info().world;
  c.host = process_info().host;
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c.rank, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &c.local_rank);
  MPI_Comm_size(local, &c.local_size);
  MPI_Comm_free(&local);

  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  std::snprintf(name, sizeof(name), "%s", c.host.c_str());
  std::vector<char> all(size_t(c.world) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD);
  std::vector<std::string> hosts;
  for (int r = 0; r < c.world; ++r) hosts.emplace_back(all.data() + size_t(r) * MPI_MAX_PROCESSOR_NAME);

  c.roles = roles_resolve(rankfile_cli, topo, hosts);
  c.role = c.roles.role[c.rank];
  set_role_indices(c);
  if (use_gpus) {
    c.gpu = c.roles.gpu[c.rank] >= 0 ? c.roles.gpu[c.rank] : c.local_rank;
#ifdef DF_HAVE_CUDA
    // More ranks on a host than GPUs (the one-GPU test machine: a target and a drafter sharing the H200):
    // ranks without a gpu= annotation share the visible GPUs round robin, which the MPI transport allows.
    const int visible = cuda_device_count();
    if (c.roles.gpu[c.rank] < 0 && visible > 0 && c.gpu >= visible) c.gpu %= visible;
#endif
  }
  c.hosts = hosts;
  c.gpus.assign(size_t(c.world), -1);
  MPI_Allgather(&c.gpu, 1, MPI_INT, c.gpus.data(), 1, MPI_INT, MPI_COMM_WORLD);
#ifdef DF_HAVE_CUDA
  constexpr bool kNcclBuilt = true;
#else
  constexpr bool kNcclBuilt = false;
#endif
  // NCCL_HOSTID of every rank: ranks that share a GPU may talk NCCL only with one id each (comm/transport.h).
  constexpr int kIdChars = 256;
  char id[kIdChars] = {0};
  if (const char* env = std::getenv("NCCL_HOSTID")) {
    DF_CHECK(std::strlen(env) < size_t(kIdChars), "NCCL_HOSTID of rank %d is %zu characters long; HINT: keep it "
             "under %d",
             c.rank, std::strlen(env), kIdChars);
    std::snprintf(id, sizeof(id), "%s", env);
  }
  std::vector<char> ids(size_t(c.world) * kIdChars);
  MPI_Allgather(id, kIdChars, MPI_CHAR, ids.data(), kIdChars, MPI_CHAR, MPI_COMM_WORLD);
  TransportRanks placed{c.hosts, c.gpus, {}};
  for (int r = 0; r < c.world; ++r) placed.host_ids.emplace_back(ids.data() + size_t(r) * kIdChars);
  const TransportChoice choice = transport_choose(transport, placed, kNcclBuilt);
  c.transport = choice.transport;
  std::string why = choice.why;
  // The feature channel's headers, host arrays and credits go over MPI whatever the transport.
  const char* over = c.transport == Transport::nccl ? "NCCL" : "MPI";
  why += topo.offline ? strfmt("; gradients over %s (features from files)", over)
                      : strfmt("; feature payloads and gradients over %s", over);

  MPI_Comm_dup(MPI_COMM_WORLD, &c.data_comm);
  MPI_Comm split;
  MPI_Comm_split(MPI_COMM_WORLD, c.role == RankRole::drafter ? 1 : MPI_UNDEFINED, c.rank, &split);
  c.drafter_comm = split;

  // One line per rank with its own facts; the job's split, role source and transport once, by rank 0.
  log_all("pid %d host %s local %d/%d role %s%d device %s cpus %s", int(getpid()), c.host.c_str(),
          c.local_rank, c.local_size, rank_role_name(c.role),
          c.role == RankRole::target ? c.target_index : c.drafter_index,
          c.gpu >= 0 ? ("cuda:" + std::to_string(c.gpu)).c_str() : "cpu", cpu_affinity().c_str());
  if (c.rank == 0) {
    log_here("%s, %s (roles from %s); transport %s (%s)", count_noun(c.num_targets(), "target").c_str(),
             count_noun(c.num_drafters(), "drafter").c_str(), c.roles.source.c_str(),
             transport_name(c.transport), why.c_str());
    log_here("roles by host: %s", roles_by_host(c.roles).c_str());
    if (!choice.test_mode.empty())
      log_here("%s: every NCCL path runs, at socket speed on loopback; no figure of this run is an interconnect's",
               choice.test_mode.c_str());
    if (!choice.warning.empty()) log_warn("%s", choice.warning.c_str());
    if (!c.roles.host_mismatch.empty())
      log_warn(
          "%s; HINT: launch with mpirun --rankfile so ranks land where the file says, or write the file "
          "for the launcher's placement (`dflash_mpi topo rankfile --slurm`)",
          c.roles.host_mismatch.c_str());
  }
  host_watch_start(c, silence_watch);
  return c;
}

#ifdef DF_HAVE_CUDA
// Every rank at once, before the first step, so a rank that cannot join fails here and not in step 1.
// The bound is generous (NCCL's set-up on a large job takes seconds to a minute) but finite, unless
// run.watchdog_s = 0 asked for no bounds at all.
constexpr double kNcclStartupS = 600;

void dist_nccl_start(DistContext& c, bool bounded) {
  if (c.transport != Transport::nccl) return;
  std::vector<std::string> names = watchdog_rank_names(c);
  for (size_t r = 0; r < names.size(); ++r) names[r] += strfmt(" (world rank %zu)", r);
  c.nccl_world = NcclComm::create(MPI_COMM_WORLD, c.gpu, "world", names, bounded ? kNcclStartupS : 0);
  // Features go from every target to every drafter (batch b to drafter b % D from target b % T).
  c.nccl_world->warm_up(c.role == RankRole::target ? c.roles.drafters : c.roles.targets);
  std::vector<std::string> drafter_names;
  for (int r : c.roles.drafters) drafter_names.push_back(names[size_t(r)]);
  // The drafters' own communicator comes from their MPI communicator (ncclCommInitRankConfig, the path the
  // one-GPU tests run), not from ncclCommSplit of the world one: on the H200 (NCCL 2.28.3) a non-blocking
  // split of a one-rank communicator never handed back its new handle.
  if (c.role == RankRole::drafter) {
    c.nccl_drafters = NcclComm::create(c.drafter_comm, c.gpu, "drafters", drafter_names, bounded ? kNcclStartupS : 0);
    c.nccl_drafters->warm_up({});
  }
  int v = 0;
  ncclGetVersion(&v);
  if (c.rank == 0)
    log_here("NCCL %d.%d.%d: world communicator of %d ranks and drafters communicator of %d, warmed up",
             v / 10000, v / 100 % 100, v % 100, c.world, c.num_drafters());
}

void dist_nccl_set_step(NcclComm* comm, int64_t step, double timeout_s) {
  if (comm) comm->set_step(step, timeout_s);
}
#else
void dist_nccl_start(DistContext&, bool) {}  // transport_choose never picks NCCL without CUDA
void dist_nccl_set_step(NcclComm*, int64_t, double) {}
#endif

void dist_finalize(DistContext& c) {
  host_watch_stop();
  c.nccl_drafters.reset();  // NCCL finalize is collective: every rank gets here after the same last step
  c.nccl_world.reset();
  if (c.drafter_comm != MPI_COMM_NULL) MPI_Comm_free(&c.drafter_comm);
  if (c.data_comm != MPI_COMM_NULL) MPI_Comm_free(&c.data_comm);
  MPI_Finalize();
  process_info().mpi_active = false;
}

void dist_nccl_stop(DistContext& c) {
  c.nccl_drafters.reset();  // collective, as in dist_finalize: every rank leaves its loop after the same step
  c.nccl_world.reset();
}

void dist_reform(DistContext& c, const RoleMap& roles) {
  DF_CHECK(c.nccl_world == nullptr && c.nccl_drafters == nullptr,
           "rank %d: re-forming roles while NCCL communicators are alive; HINT: dist_nccl_stop first", c.rank);
  if (c.drafter_comm != MPI_COMM_NULL) MPI_Comm_free(&c.drafter_comm);
  MPI_Comm_free(&c.data_comm);
  c.roles = roles;
  c.role = roles.role[size_t(c.rank)];
  set_role_indices(c);
  MPI_Comm_dup(MPI_COMM_WORLD, &c.data_comm);
  MPI_Comm_split(MPI_COMM_WORLD, c.role == RankRole::drafter ? 1 : MPI_UNDEFINED, c.rank, &c.drafter_comm);
  host_watch_set_roles(c.roles);
  log_all("re-formed: role %s%d device %s", rank_role_name(c.role),
          c.role == RankRole::target ? c.target_index : c.drafter_index,
          c.gpu >= 0 ? ("cuda:" + std::to_string(c.gpu)).c_str() : "cpu");
  if (c.rank == 0) {
    log_here("re-formed: %s, %s", count_noun(c.num_targets(), "target").c_str(),
             count_noun(c.num_drafters(), "drafter").c_str());
    log_here("roles by host: %s", roles_by_host(c.roles).c_str());
  }
}

void signals_install() {
  if (const char* f = std::getenv("DFLASH_STOP_FILE"); f && *f) g_stop_file = f;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

bool signals_stop_requested() {
  if (g_stop_signal.load() != 0) return true;
  if (g_stop_file.empty() || access(g_stop_file.c_str(), F_OK) != 0) return false;
  g_stop_signal.store(kStopFileSeen);  // asked once: the file may go while the ranks agree on the step
  return true;
}

}  // namespace df
