// Host lists for multi-host placement: a plain comma list (--hosts) or the SLURM allocation (--slurm),
// whose compressed form `node[01-03,07]` is expanded by scontrol when installed, else by a built-in expander.
#pragma once
#include <string>
#include <vector>

namespace df {

// "a,b" / "node[01-03,07]" / "rack[1-2]-gpu[1,3]" -> one name per host, in order. Throws on malformed text.
std::vector<std::string> hostlist_expand(const std::string& text);

// SLURM_JOB_NODELIST (else SLURM_NODELIST) expanded with `scontrol show hostnames` when that works,
// otherwise with hostlist_expand. Throws when neither variable is set (not inside an allocation).
std::vector<std::string> hostlist_from_slurm();

}  // namespace df
