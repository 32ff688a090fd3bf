// Host-loss detection; see host_watch.h. Plain sockets rather than MPI: MPI runs funneled (only the main
// thread may call it), and Open MPI 4.1 has no way to report which peers are gone; the kernel closes a
// killed process's sockets at once, so a closed connection without the goodbye byte is the signal.
#include "dist/host_watch.h"

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
#include <set>
#include <thread>

#include "core/log.h"
#include "core/strfmt.h"

namespace df {

namespace {

constexpr char kGoodbye = 'B';
constexpr int kAddrLen = 64;
// Ranks of one host die within a moment of each other (one kill, one power cut): gather for this long after
// the first loss so the message names them all.
constexpr auto kGatherWindow = std::chrono::milliseconds(200);
constexpr int kConnectTimeoutMs = 5000;

struct Watch {
  std::vector<int> incoming;               // sockets of the watchers watching this rank
  std::vector<std::pair<int, int>> peers;  // (socket, world rank) this rank watches
  std::atomic<bool> stop{false};
  std::thread thread;
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

[[noreturn]] void report_and_exit(const RoleMap& roles, const std::vector<int>& lost) {
  const ProcessInfo& p = process_info();
  std::fprintf(stderr, "[rank %d %s] FATAL: %s\n", p.rank, p.host.c_str(),
               host_watch_loss_message(roles, lost).c_str());
  std::fflush(stderr);
  std::_Exit(4);
}

void watch_loop(RoleMap roles) {
  std::vector<int> lost;
  auto first_loss = std::chrono::steady_clock::time_point{};
  while (!g_watch.stop.load() && !g_watch.peers.empty()) {
    std::vector<pollfd> fds;
    for (auto [fd, rank] : g_watch.peers) fds.push_back({fd, POLLIN, 0});
    poll(fds.data(), fds.size(), 100);
    for (size_t i = fds.size(); i-- > 0;) {
      if (!fds[i].revents) continue;
      char c = 0;
      const ssize_t n = recv(fds[i].fd, &c, 1, MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n != 1 || c != kGoodbye) {
        if (lost.empty()) first_loss = std::chrono::steady_clock::now();
        lost.push_back(g_watch.peers[i].second);
      }
      close(fds[i].fd);
      g_watch.peers.erase(g_watch.peers.begin() + long(i));
    }
    if (!lost.empty() && std::chrono::steady_clock::now() - first_loss > kGatherWindow) break;
  }
  if (!lost.empty() && !g_watch.stop.load()) report_and_exit(roles, lost);
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

void host_watch_start(const DistContext& ctx) {
  const std::set<std::string> hosts(ctx.roles.hosts.begin(), ctx.roles.hosts.end());
  if (hosts.size() < 2) return;
  // Every rank listens; the first rank of each host connects to every rank of the other hosts.
  int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  socklen_t len = sizeof(sa);
  std::string ip = local_address(ctx.host);
  char addr[kAddrLen] = {0};
  if (!ip.empty() && listener >= 0 && bind(listener, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0 &&
      listen(listener, 256) == 0 && getsockname(listener, reinterpret_cast<sockaddr*>(&sa), &len) == 0)
    std::snprintf(addr, sizeof(addr), "%s:%d", ip.c_str(), int(ntohs(sa.sin_port)));
  else if (ctx.local_rank == 0)
    log_warn(
        "host watch: no listening address for host %s (its name resolves to %s): the other hosts cannot "
        "tell when this rank is lost; HINT: make the host name resolve to the address the hosts share",
        ctx.host.c_str(), ip.empty() ? "nothing but loopback" : ip.c_str());
  std::vector<char> all(size_t(ctx.world) * kAddrLen);
  MPI_Allgather(addr, kAddrLen, MPI_CHAR, all.data(), kAddrLen, MPI_CHAR, MPI_COMM_WORLD);
  if (ctx.local_rank == 0) {
    for (int r = 0; r < ctx.world; ++r) {
      const std::string peer(all.data() + size_t(r) * kAddrLen);
      if (ctx.roles.hosts[r] == ctx.host || peer.empty()) continue;
      const int fd = connect_to(peer);
      if (fd < 0)
        log_warn("host watch: cannot connect to rank %d at %s: its loss will show only through the launcher",
                 r, peer.c_str());
      else
        g_watch.peers.push_back({fd, r});
    }
  }
  // Every connect has completed (it returns once the peer's kernel queued it), so the queue holds them all.
  MPI_Barrier(MPI_COMM_WORLD);
  if (listener >= 0) {
    fcntl(listener, F_SETFL, fcntl(listener, F_GETFL) | O_NONBLOCK);
    for (int fd; (fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC)) >= 0;)
      g_watch.incoming.push_back(fd);
    close(listener);
  }
  if (!g_watch.peers.empty()) g_watch.thread = std::thread(watch_loop, ctx.roles);
}

void host_watch_stop() {
  g_watch.stop = true;
  for (int fd : g_watch.incoming) {
    const ssize_t n = send(fd, &kGoodbye, 1, MSG_NOSIGNAL);
    (void)n;  // a watcher that is already gone needs no goodbye
    close(fd);
  }
  g_watch.incoming.clear();
  if (g_watch.thread.joinable()) g_watch.thread.join();
  for (auto [fd, rank] : g_watch.peers) close(fd);
  g_watch.peers.clear();
}

}  // namespace df
