// Logging: log_info prints on rank 0 only, log_all on every rank with a "[rank r host]" prefix.
// The process identity is set once after MPI_Init (or left as rank 0 of 1 in single-process tools).
#pragma once
#include <string>

namespace df {

struct ProcessInfo {
  int rank = 0;
  int world = 1;
  std::string host = "localhost";
  bool mpi_active = false;  // MPI_Init done and not yet finalised: fatal errors go through MPI_Abort
};

ProcessInfo& process_info();
void process_info_init_from_mpi();  // fills rank/world/host from MPI_COMM_WORLD

void log_info(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void log_all(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warn(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// Prints on this rank, no prefix: for the rank that owns a report (e.g. the metrics line of drafter 0).
void log_here(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// The current UTC time in a strftime format, for records and file names (e.g. "%Y-%m-%dT%H:%M:%SZ").
std::string utc_now(const char* format);

// Prints the error with rank and host and ends the whole job: MPI_Abort when MPI is up, exit(1) otherwise.
[[noreturn]] void fatal_abort(const std::string& what);

}  // namespace df
