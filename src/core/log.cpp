// Rank-aware logging and the one place that ends the job on a fatal error.
#include "core/log.h"

#include <mpi.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>

#include "core/strfmt.h"

namespace df {

namespace {
std::mutex g_log_mutex;

void log_line(FILE* f, const char* prefix, const char* fmt, va_list ap) {
  std::string msg = vstrfmt(fmt, ap);
  std::lock_guard<std::mutex> lock(g_log_mutex);
  std::fprintf(f, "%s%s\n", prefix, msg.c_str());
  std::fflush(f);
}
}  // namespace

ProcessInfo& process_info() {
  static ProcessInfo info = [] {
    ProcessInfo p;
    char host[256] = {0};
    if (gethostname(host, sizeof(host) - 1) == 0) p.host = host;
    return p;
  }();
  return info;
}

void process_info_init_from_mpi() {
  ProcessInfo& p = process_info();
  MPI_Comm_rank(MPI_COMM_WORLD, &p.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p.world);
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(name, &len);
  p.host.assign(name, len);
  p.mpi_active = true;
}

std::string utc_now(const char* format) {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), format, &tm);
  return buf;
}

void log_info(const char* fmt, ...) {
  if (process_info().rank != 0) return;
  va_list ap;
  va_start(ap, fmt);
  log_line(stdout, "", fmt, ap);
  va_end(ap);
}

void log_all(const char* fmt, ...) {
  const ProcessInfo& p = process_info();
  std::string prefix = strfmt("[rank %d %s] ", p.rank, p.host.c_str());
  va_list ap;
  va_start(ap, fmt);
  log_line(stdout, prefix.c_str(), fmt, ap);
  va_end(ap);
}

void log_here(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  log_line(stdout, "", fmt, ap);
  va_end(ap);
}

void log_warn(const char* fmt, ...) {
  const ProcessInfo& p = process_info();
  std::string prefix = strfmt("[rank %d %s] WARNING: ", p.rank, p.host.c_str());
  va_list ap;
  va_start(ap, fmt);
  log_line(stderr, prefix.c_str(), fmt, ap);
  va_end(ap);
}

void fatal_abort(const std::string& what) {
  const ProcessInfo& p = process_info();
  {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    std::fprintf(stderr, "[rank %d %s] FATAL: %s\n", p.rank, p.host.c_str(), what.c_str());
    std::fflush(stderr);
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (p.mpi_active && !finalized && p.world > 1) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

}  // namespace df
