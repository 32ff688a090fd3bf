// SLURM-style host list expansion. scontrol is the authority when present; the built-in expander covers
// the forms SLURM prints (prefix[ranges]suffix, zero padding kept, several bracket groups) for hosts
// where only the environment variable is available (containers, login nodes without Slurm tools).
#include "topo/hostlist.h"

#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace df {

namespace {

// Splits on commas that are not inside brackets.
std::vector<std::string> split_top_level(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  for (char c : text) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    DF_CHECK(depth >= 0 && depth <= 1, "host list '%s': unbalanced or nested brackets", text.c_str());
    if (c == ',' && depth == 0) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  DF_CHECK(depth == 0, "host list '%s': unclosed '['", text.c_str());
  out.push_back(cur);
  return out;
}

void expand_one(const std::string& whole, const std::string& item, std::vector<std::string>& out) {
  size_t open = item.find('[');
  if (open == std::string::npos) {
    DF_CHECK(!item.empty() && item.find(']') == std::string::npos, "host list '%s': empty or malformed name '%s'",
             whole.c_str(), item.c_str());
    out.push_back(item);
    return;
  }
  size_t close = item.find(']', open);
  std::string prefix = item.substr(0, open), body = item.substr(open + 1, close - open - 1), rest = item.substr(close + 1);
  DF_CHECK(!body.empty(), "host list '%s': empty brackets", whole.c_str());
  size_t start = 0;
  while (start <= body.size()) {
    size_t comma = body.find(',', start);
    std::string range = body.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t dash = range.find('-');
    std::string lo_s = range.substr(0, dash), hi_s = dash == std::string::npos ? lo_s : range.substr(dash + 1);
    auto digits = [](const std::string& s) {
      return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
    };
    DF_CHECK(digits(lo_s) && digits(hi_s), "host list '%s': range '%s' is not N or N-M", whole.c_str(), range.c_str());
    long lo = std::stol(lo_s), hi = std::stol(hi_s);
    DF_CHECK(lo <= hi && hi - lo < 100000, "host list '%s': range '%s' is reversed or too large", whole.c_str(),
             range.c_str());
    int width = static_cast<int>(lo_s.size());
    for (long v = lo; v <= hi; ++v) expand_one(whole, prefix + strfmt("%0*ld", width, v) + rest, out);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
}

}  // namespace

std::vector<std::string> hostlist_expand(const std::string& text) {
  DF_CHECK(!text.empty(), "empty host list");
  std::vector<std::string> out;
  for (const std::string& item : split_top_level(text)) expand_one(text, item, out);
  return out;
}

std::vector<std::string> hostlist_from_slurm() {
  const char* list = std::getenv("SLURM_JOB_NODELIST");
  if (!list || !*list) list = std::getenv("SLURM_NODELIST");
  DF_CHECK(list && *list, "--slurm: SLURM_JOB_NODELIST is not set; run inside an allocation (salloc/sbatch) "
                          "or pass --hosts h1,h2");
  std::string text = list;
  DF_CHECK(text.find_first_of("'\"\\$`;|&<>") == std::string::npos, "SLURM_JOB_NODELIST '%s' has shell characters",
           list);
  std::vector<std::string> hosts;
  if (FILE* p = popen(("scontrol show hostnames '" + text + "' 2>/dev/null").c_str(), "r")) {
    char line[512];
    while (std::fgets(line, sizeof(line), p)) {
      std::string h = line;
      while (!h.empty() && (h.back() == '\n' || h.back() == ' ')) h.pop_back();
      if (!h.empty()) hosts.push_back(h);
    }
    if (pclose(p) != 0) hosts.clear();
  }
  return hosts.empty() ? hostlist_expand(text) : hosts;
}

}  // namespace df
