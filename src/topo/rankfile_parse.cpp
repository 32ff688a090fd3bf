// Reads rankfiles back into roles and GPUs for the training bootstrap. Strict on what the roles need
// (every line's rank, host, slot and role) so a hand-edited file fails at start-up with its line number,
// not as a hang when the world has fewer drafters than the file implied.
#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "topo/rankfile.h"

namespace df {

namespace {

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r"), b = s.find_last_not_of(" \t\r");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

bool parse_int_strict(const std::string& s, int& v) {
  if (s.empty() || s.size() > 9) return false;
  size_t start = s[0] == '-' ? 1 : 0;
  if (start == s.size() || s.find_first_not_of("0123456789", start) != std::string::npos) return false;
  v = std::stoi(s);
  return true;
}

// "role=drafter gpu=7 numa=1" into the entry; `where` is "file:line" for messages.
void parse_annotations(const std::string& text, const std::string& where, RankfileEntry& e, bool& has_role) {
  std::stringstream ss(text);
  std::string kv;
  while (ss >> kv) {
    if (kv == "pinned") {
      e.pinned = true;
      continue;
    }
    size_t eq = kv.find('=');
    DF_CHECK(eq != std::string::npos && eq > 0, "%s: annotation '%s' is not key=value (or `pinned`)", where.c_str(),
             kv.c_str());
    std::string key = kv.substr(0, eq), val = kv.substr(eq + 1);
    if (key == "role") {
      DF_CHECK(val == "target" || val == "drafter", "%s: role '%s' must be target or drafter", where.c_str(),
               val.c_str());
      e.role = val == "drafter" ? RankRole::drafter : RankRole::target;
      has_role = true;
    } else if (key == "gpu") {
      DF_CHECK(parse_int_strict(val, e.gpu) && e.gpu >= 0, "%s: gpu '%s' must be an integer >= 0",
               where.c_str(), val.c_str());
    } else if (key == "numa") {
      DF_CHECK(parse_int_strict(val, e.numa) && e.numa >= -1, "%s: numa '%s' must be an integer >= -1",
               where.c_str(), val.c_str());
    } else if (key == "index") {
      DF_CHECK(parse_int_strict(val, e.index) && e.index >= 0, "%s: index '%s' must be an integer >= 0",
               where.c_str(), val.c_str());
    }
  }
}

}  // namespace

std::vector<RankfileEntry> rankfile_parse_text(const std::string& text, const std::string& name) {
  std::vector<RankfileEntry> out;
  std::vector<int> line_of;
  std::stringstream in(text);
  std::string raw;
  for (int lineno = 1; std::getline(in, raw); ++lineno) {
    std::string where = strfmt("%s:%d", name.c_str(), lineno);
    size_t hash = raw.find('#');
    std::string body = trim(raw.substr(0, hash));
    if (body.empty()) continue;
    RankfileEntry e;
    std::stringstream ls(body);
    std::string word, assign, slot, extra;
    ls >> word >> assign >> slot;
    DF_CHECK(word == "rank" && !(ls >> extra), "%s: expected `rank N=HOST slot=LIST`, got '%s'",
             where.c_str(), body.c_str());
    size_t eq = assign.find('=');
    DF_CHECK(eq != std::string::npos && parse_int_strict(assign.substr(0, eq), e.rank) && e.rank >= 0,
             "%s: '%s' is not N=HOST with a rank N >= 0", where.c_str(), assign.c_str());
    e.host = assign.substr(eq + 1);
    DF_CHECK(!e.host.empty(), "%s: rank %d has no host after '='", where.c_str(), e.rank);
    DF_CHECK(slot.rfind("slot=", 0) == 0 && slot.size() > 5 &&
                 slot.find_first_not_of("0123456789,:-", 5) == std::string::npos,
             "%s: '%s' is not slot=LIST (digits, ',', '-', ':')", where.c_str(), slot.c_str());
    e.slot = slot.substr(5);
    bool has_role = false;
    if (hash != std::string::npos) parse_annotations(raw.substr(hash + 1), where, e, has_role);
    DF_CHECK(has_role, "%s: rank %d has no `# role=target` or `# role=drafter` annotation", where.c_str(),
             e.rank);
    for (size_t i = 0; i < out.size(); ++i)
      DF_CHECK(out[i].rank != e.rank, "%s: rank %d already given on line %d", where.c_str(), e.rank,
               line_of[i]);
    out.push_back(std::move(e));
    line_of.push_back(lineno);
  }
  DF_CHECK(!out.empty(), "%s: no `rank N=HOST slot=LIST` line", name.c_str());
  std::sort(out.begin(), out.end(),
            [](const RankfileEntry& a, const RankfileEntry& b) { return a.rank < b.rank; });
  for (size_t i = 0; i < out.size(); ++i)
    DF_CHECK(out[i].rank == static_cast<int>(i), "%s: rank %zu is missing (ranks must run 0..%zu)",
             name.c_str(), i, out.size() - 1);
  // A role index decides which batches a rank gets: a half-annotated file or a repeated index would pair
  // targets and drafters other than the file's author meant.
  const size_t indexed =
      std::count_if(out.begin(), out.end(), [](const RankfileEntry& e) { return e.index >= 0; });
  DF_CHECK(indexed == 0 || indexed == out.size(),
           "%s: %zu of %zu ranks carry `index=`; HINT: give every rank its index or none (then rank order "
           "decides), e.g. rewrite the file with `dflash_mpi topo rankfile`",
           name.c_str(), indexed, out.size());
  for (RankRole role : {RankRole::target, RankRole::drafter}) {
    std::vector<int> ranks = rankfile_role_ranks(out, role);
    for (size_t i = 0; indexed > 0 && i < ranks.size(); ++i)
      DF_CHECK(out[ranks[i]].index == static_cast<int>(i),
               "%s: %s indices must run 0..%zu once each, but rank %d has index=%d; HINT: rewrite the file "
               "with `dflash_mpi topo rankfile`",
               name.c_str(), rank_role_name(role), ranks.size() - 1, ranks[i], out[ranks[i]].index);
  }
  return out;
}

std::vector<RankfileEntry> rankfile_parse(const std::string& path) {
  std::ifstream f(path);
  DF_CHECK(f.good(), "cannot open rankfile '%s': check the path (relative to mpirun's working directory)",
           path.c_str());
  std::stringstream ss;
  ss << f.rdbuf();
  return rankfile_parse_text(ss.str(), path);
}

}  // namespace df
