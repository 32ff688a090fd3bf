// Host-loss and hang detection. The first rank of every host holds a plain TCP connection to every other
// rank (on a single host its second rank also watches it). A rank on another host that ends without saying
// goodbye (killed, its host gone) closes its end and the watcher names it, its role and its host at once,
// before the launcher's own teardown, which names only the first process it noticed; a rank on the same host
// that dies is the launcher's to report. Every watched rank sends a heartbeat each second from its own thread:
// a rank that falls silent (stopped, frozen, its host unreachable without closing anything) is named within
// 30 s, where the waiting ranks' watchdogs would wait out their bounds (half an hour at start-up). The
// watcher then ends its own rank, so the rest of the job follows.
#pragma once
#include <string>
#include <vector>

#include "comm/dist.h"

namespace df {

// Sets up the connections (collective over MPI_COMM_WORLD; every rank must call it) and starts the watcher
// thread on each watching rank and the heartbeat thread on each watched one. Nothing for a single rank. A
// rank whose host name does not resolve or whose connection fails is left unwatched, with a warning; the run
// goes on. silence: whether a silent rank ends the job (deaths are reported either way).
void host_watch_start(const DistContext& ctx, bool silence = true);

// The roles a loss message names, after a run re-formed them (pipeline/rebalance.h).
void host_watch_set_roles(const RoleMap& roles);

// A clean end: every rank tells its watchers it is finishing, then the watcher stops. Call before
// MPI_Finalize, after the final barrier, on every rank.
void host_watch_stop();

// The message for ranks lost at once: grouped by host, each with its role, and whether that was every rank
// of the host. Exposed for the unit test.
std::string host_watch_loss_message(const RoleMap& roles, const std::vector<int>& lost);
// The message for ranks that fell silent: each with its role and host, and the likely causes.
std::string host_watch_silence_message(const RoleMap& roles, const std::vector<int>& silent);

}  // namespace df
