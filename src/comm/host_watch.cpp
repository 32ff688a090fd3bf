// Host-loss and hang detection; see host_watch.h. Plain sockets rather than MPI: MPI runs funneled (only the
// main thread may call it), and Open MPI 4.1 has no way to report which peers are gone; the kernel closes a
// killed process's sockets at once, so a closed connection without the goodbye byte is the signal. A process
// that is stopped, or whose host froze or dropped off the network, closes nothing: every rank's heartbeat
// thread sends a byte a second, and silence past kHeartbeatTimeout is the signal for those.
#include "comm/host_watch.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "core/log.h"
#include "core/strfmt.h"

namespace df {

namespace {

constexpr char kGoodbye = 'B', kHeartbeat = 'H';
constexpr auto kHeartbeatInterval = std::chrono::seconds(1);
// Far above any scheduling delay of a thread that only sleeps and writes a byte (CI runs ranks 5× over-
// subscribed), well inside the minute within which a hung peer must be named.
constexpr auto kHeartbeatTimeout = std::chrono::seconds(30);
constexpr int kAddrLen = 64;
// Ranks of one host die within a moment of each other (one kill, one power cut): gather for this long after
// the first loss so the message names them all.
constexpr auto kGatherWindow = std::chrono::milliseconds(200);
constexpr int kConnectTimeoutMs = 5000;

struct Peer {
  int fd = -1, rank = -1;
  bool same_host = false;  // its death is the launcher's to report (it sees the exit at once); its silence is ours
  std::chrono::steady_clock::time_point last_heard;
};

struct Watch {
  std::vector<int> incoming;  // sockets of the watchers watching this rank
  std::vector<Peer> peers;    // the ranks this rank watches
  std::atomic<bool> stop{false};
  bool silence = true;  // a silent peer ends the job
  std::thread thread, heartbeat;
  std::mutex roles_mu;  // the roles named in messages change when a run re-forms them (host_watch_set_roles)
  RoleMap roles;
};
Watch g_watch;

// This host's IPv4 address as the other hosts reach it: its name resolved as they resolve it, loopback
// skipped (Debian maps the host name to 127.0.1.1, which would reach the watcher's own host).
std::string local_address(const std::string& host) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return "";
  std::string out;
  for (addrinfo* a = res; a && out.empty(); a = a->ai_next) {
    char buf[INET_ADDRSTRLEN] = {0};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, buf, sizeof(buf));
    if (std::string(buf).rfind("127.", 0) != 0) out = buf;
  }
  freeaddrinfo(res);
  return out;
}

int connect_to(const std::string& addr) {
  const size_t colon = addr.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(uint16_t(std::stoi(addr.substr(colon + 1))));
  if (inet_pton(AF_INET, addr.substr(0, colon).c_str(), &sa.sin_addr) != 1) return -1;
  // Non-blocking with a bound: a firewall that drops packets would otherwise hold start-up for minutes.
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  int err = connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0 ? 0 : errno;
  if (err == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    socklen_t len = sizeof(err);
    err = poll(&p, 1, kConnectTimeoutMs) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0
              ? err
              : ETIMEDOUT;
  }
  if (err != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

void heartbeat_loop() {
  while (!g_watch.stop.load()) {
    for (int fd : g_watch.incoming) {
      const ssize_t n = send(fd, &kHeartbeat, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      (void)n;  // a watcher that is gone, or a full buffer (the watcher is itself stopped), needs no beat
    }
    std::this_thread::sleep_for(kHeartbeatInterval);
  }
}

void watch_loop() {
  std::vector<int> lost, silent;
  auto first_loss = std::chrono::steady_clock::time_point{};
  auto note = [&](std::vector<int>& list, int rank) {
    if (lost.empty() && silent.empty()) first_loss = std::chrono::steady_clock::now();
    list.push_back(rank);
  };
  while (!g_watch.stop.load() && !g_watch.peers.empty()) {
    std::vector<pollfd> fds;
    for (const Peer& p : g_watch.peers) fds.push_back({p.fd, POLLIN, 0});
    poll(fds.data(), fds.size(), 100);
    const auto now = std::chrono::steady_clock::now();
    for (size_t i = fds.size(); i-- > 0;) {
      Peer& peer = g_watch.peers[i];
      bool gone = false;
      if (fds[i].revents) {
        char buf[64];
        const ssize_t n = recv(peer.fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (n > 0 && std::memchr(buf, kGoodbye, size_t(n)) == nullptr) {
          peer.last_heard = now;
          continue;
        }
        gone = true;  // the goodbye, or closed without it: lost unless the launcher sees it first
        if (n <= 0 && !peer.same_host) note(lost, peer.rank);
      } else if (g_watch.silence && now - peer.last_heard > kHeartbeatTimeout) {
        gone = true;
        note(silent, peer.rank);
      }
      if (gone) {
        close(peer.fd);
        g_watch.peers.erase(g_watch.peers.begin() + long(i));
      }
    }
    if ((!lost.empty() || !silent.empty()) && std::chrono::steady_clock::now() - first_loss > kGatherWindow) break;
  }
  if ((lost.empty() && silent.empty()) || g_watch.stop.load()) return;
  const ProcessInfo& p = process_info();
  RoleMap roles;
  {
    std::lock_guard<std::mutex> lock(g_watch.roles_mu);
    roles = g_watch.roles;
  }
  std::string msg = lost.empty() ? "" : host_watch_loss_message(roles, lost);
  if (!silent.empty()) msg += (msg.empty() ? "" : "; ") + host_watch_silence_message(roles, silent);
  std::fprintf(stderr, "[rank %d %s] FATAL: %s\n", p.rank, p.host.c_str(), msg.c_str());
  std::fflush(stderr);
  std::_Exit(4);
}

}  // namespace

std::string host_watch_loss_message(const RoleMap& roles, const std::vector<int>& lost) {
  std::map<std::string, std::vector<int>> by_host;
  for (int r : std::set<int>(lost.begin(), lost.end())) by_host[roles.hosts[r]].push_back(r);
  std::string out;
  for (const auto& [host, ranks] : by_host) {
    const size_t on_host = size_t(std::count(roles.hosts.begin(), roles.hosts.end(), host));
    std::string names;
    for (int r : ranks) names += (names.empty() ? "" : " ") + roles_label(roles, r);
    out += strfmt("%slost host %s: rank%s %s (%s) ended without finishing", out.empty() ? "" : "; ",
                  host.c_str(), ranks.size() > 1 ? "s" : "", names.c_str(),
                  ranks.size() == on_host ? strfmt("all %zu of its ranks", on_host).c_str()
                                          : strfmt("%zu of its %zu ranks", ranks.size(), on_host).c_str());
  }
  return out +
         "; the host went down or its processes were killed (a rank that failed on its own prints its "
         "own FATAL line). HINT: the last checkpoint resumes the run (checkpoint.resume = \"auto\"), on "
         "fewer hosts too, with the same drafters x train.grad_accum";
}

std::string host_watch_silence_message(const RoleMap& roles, const std::vector<int>& silent) {
  std::string names;
  for (int r : std::set<int>(silent.begin(), silent.end()))
    names += strfmt("%s%s on host %s", names.empty() ? "" : ", ", roles_label(roles, r).c_str(),
                    roles.hosts[r].c_str());
  return strfmt("rank%s %s sent no heartbeat for %lld s: stopped (SIGSTOP, a debugger), frozen, or its host is "
                "unreachable; ending the job rather than waiting on it. HINT: the last checkpoint resumes the run "
                "(checkpoint.resume = \"auto\")",
                silent.size() > 1 ? "s" : "", names.c_str(),
                (long long)std::chrono::duration_cast<std::chrono::seconds>(kHeartbeatTimeout).count());
}

void host_watch_start(const DistContext& ctx, bool silence) {
  g_watch.silence = silence;
  const std::set<std::string> hosts(ctx.roles.hosts.begin(), ctx.roles.hosts.end());
  if (ctx.world < 2) return;
  const bool one_host = hosts.size() == 1;
  // Every rank listens. The first rank of each host watches every other rank; on one host its second rank
  // watches the first. On one host loopback serves; across hosts the address the others resolve for it.
  int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  socklen_t len = sizeof(sa);
  const std::string ip = one_host ? "127.0.0.1" : local_address(ctx.host);
  if (one_host) inet_pton(AF_INET, ip.c_str(), &sa.sin_addr);
  char addr[kAddrLen] = {0};
  if (!ip.empty() && listener >= 0 && bind(listener, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0 &&
      listen(listener, 256) == 0 && getsockname(listener, reinterpret_cast<sockaddr*>(&sa), &len) == 0)
    std::snprintf(addr, sizeof(addr), "%s:%d", ip.c_str(), int(ntohs(sa.sin_port)));
  else if (ctx.local_rank == 0)
    log_warn(
        "host watch: no listening address for host %s (its name resolves to %s): the other ranks cannot "
        "tell when this rank is lost; HINT: make the host name resolve to the address the hosts share",
        ctx.host.c_str(), ip.empty() ? "nothing but loopback" : ip.c_str());
  std::vector<char> all(size_t(ctx.world) * kAddrLen);
  MPI_Allgather(addr, kAddrLen, MPI_CHAR, all.data(), kAddrLen, MPI_CHAR, MPI_COMM_WORLD);
  auto watch = [&](int r) {
    const std::string peer(all.data() + size_t(r) * kAddrLen);
    if (peer.empty()) return;
    const int fd = connect_to(peer);
    if (fd < 0)
      log_warn("host watch: cannot connect to rank %d at %s: its loss will show only through the launcher", r,
               peer.c_str());
    else
      g_watch.peers.push_back({fd, r, ctx.roles.hosts[r] == ctx.host, std::chrono::steady_clock::now()});
  };
  if (ctx.local_rank == 0)
    for (int r = 0; r < ctx.world; ++r)
      if (r != ctx.rank) watch(r);
  // Local ranks are numbered in world order (dist.cpp splits by host keyed on the world rank): on one host
  // local rank 0 is world rank 0.
  if (one_host && ctx.local_rank == 1) watch(0);
  // Every connect has completed (it returns once the peer's kernel queued it), so the queue holds them all.
  MPI_Barrier(MPI_COMM_WORLD);
  if (listener >= 0) {
    fcntl(listener, F_SETFL, fcntl(listener, F_GETFL) | O_NONBLOCK);
    for (int fd; (fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC)) >= 0;)
      g_watch.incoming.push_back(fd);
    close(listener);
  }
  host_watch_set_roles(ctx.roles);
  if (!g_watch.peers.empty()) g_watch.thread = std::thread(watch_loop);
  if (!g_watch.incoming.empty()) g_watch.heartbeat = std::thread(heartbeat_loop);
}

void host_watch_set_roles(const RoleMap& roles) {
  std::lock_guard<std::mutex> lock(g_watch.roles_mu);
  g_watch.roles = roles;
}

void host_watch_stop() {
  g_watch.stop = true;
  if (g_watch.heartbeat.joinable()) g_watch.heartbeat.join();
  for (int fd : g_watch.incoming) {
    const ssize_t n = send(fd, &kGoodbye, 1, MSG_NOSIGNAL);
    (void)n;  // a watcher that is already gone needs no goodbye
    close(fd);
  }
  g_watch.incoming.clear();
  if (g_watch.thread.joinable()) g_watch.thread.join();
  for (const Peer& p : g_watch.peers) close(p.fd);
  g_watch.peers.clear();
}

}  // namespace df
