// Host-loss detection: on a multi-host run, the first rank of every host holds a plain TCP connection to each
// rank of the other hosts. A rank that ends without saying goodbye (killed, its host gone) closes its end
// and the watcher names it, its role and its host at once, before the launcher's own teardown, which names
// only the first process it noticed. The watcher then ends its own rank, so the rest of the job follows.
#pragma once
#include <string>
#include <vector>

#include "dist/dist.h"

namespace df {

// Sets up the connections (collective over MPI_COMM_WORLD; every rank must call it) and starts the watcher
// thread on each host's first rank. Does nothing on a single host. A rank whose host name does not resolve
// or whose connection fails is left unwatched, with a warning; the run goes on.
void host_watch_start(const DistContext& ctx);

// A clean end: every rank tells its watchers it is finishing, then the watcher stops. Call before
// MPI_Finalize, after the final barrier, on every rank.
void host_watch_stop();

// The message for ranks lost at once: grouped by host, each with its role, and whether that was every rank
// of the host. Exposed for the unit test.
std::string host_watch_loss_message(const RoleMap& roles, const std::vector<int>& lost);

}  // namespace df
