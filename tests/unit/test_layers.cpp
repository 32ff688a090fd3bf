// Layers point one way (DESIGN.md "Module map"): every #include "..." in src/ and kernels/ names a file of the
// including file's own layer or of one that the table below lets it use, as a path from the repository root
// or from src/. An include that points up fails here, naming the file, the line and what that layer may use.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

// core ← kernels ← ops ← model ← train ← pipeline ← cli. Beside that chain: data (token and feature files)
// needs only core; topo (placement and memory planning) sizes the models and their kernels' workspaces; comm
// sits beside pipeline, moving the ops' buffers between the ranks topo placed, and never sees a model or the
// training.
const std::map<std::string, std::set<std::string>> kMayInclude = {
    {"core", {}},
    {"kernels", {"core"}},
    {"data", {"core"}},
    {"ops", {"core", "kernels"}},
    {"model", {"core", "kernels", "ops"}},
    {"train", {"core", "kernels", "data", "ops", "model"}},
    {"topo", {"core", "kernels", "data", "ops", "model", "train"}},
    {"comm", {"core", "kernels", "ops", "topo"}},
    {"pipeline", {"core", "kernels", "data", "ops", "model", "train", "topo", "comm"}},
    {"cli", {"core", "kernels", "data", "ops", "model", "train", "topo", "comm", "pipeline"}},
};

// The layer of a file given by its path from the repository root: kernels/... or src/<layer>/....
std::string layer_of(const std::string& rel) {
  const size_t slash = rel.find('/');
  if (rel.compare(0, slash, "kernels") == 0) return "kernels";
  const size_t next = rel.find('/', slash + 1);
  return next == std::string::npos ? "" : rel.substr(slash + 1, next - slash - 1);
}

// "file:line: message" for each quoted include of `text` (the file `rel`) that its layer may not use.
std::vector<std::string> layer_violations(const std::string& rel, std::istream& text) {
  std::vector<std::string> out;
  const std::string from = layer_of(rel);
  const auto allowed = kMayInclude.find(from);
  if (allowed == kMayInclude.end()) return {rel + ": folder '" + from + "' is not a layer of test_layers.cpp's table"};
  std::string line;
  for (int n = 1; std::getline(text, line); ++n) {
    const size_t at = line.find_first_not_of(" \t");
    if (at == std::string::npos || line.compare(at, 10, "#include \"") != 0) continue;
    const std::string path = line.substr(at + 10, line.find('"', at + 10) - at - 10);
    const std::string to = path.substr(0, path.find('/'));
    const std::string where = rel + ":" + std::to_string(n) + ": #include \"" + path + "\": ";
    if (!kMayInclude.count(to) || path.find('/') == std::string::npos)
      out.push_back(where + "not a path from the repository root or src/ (kernels/..., core/...)");
    else if (to != from && !allowed->second.count(to))
      out.push_back(where + "layer " + from + " includes " + to + ", which sits above it");
  }
  return out;
}

std::vector<std::string> violations_of(const std::string& rel, const std::string& text) {
  std::istringstream in(text);
  return layer_violations(rel, in);
}

}  // namespace

TEST(Layers, NoIncludePointsUp) {
  namespace fs = std::filesystem;
  const fs::path root(DF_SOURCE_DIR);
  std::vector<std::string> bad;
  int files = 0;
  for (const char* top : {"src", "kernels"})
    for (const auto& e : fs::recursive_directory_iterator(root / top)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".h" && ext != ".cpp" && ext != ".cu" && ext != ".cuh")) continue;
      const std::string rel = fs::relative(e.path(), root).generic_string();
      std::ifstream in(e.path());
      for (std::string& v : layer_violations(rel, in)) bad.push_back(std::move(v));
      ++files;
    }
  EXPECT_GT(files, 100);  // the walk found the tree
  std::string all;
  for (const std::string& v : bad) all += v + "\n";
  EXPECT_TRUE(bad.empty()) << all;
}

TEST(Layers, CheckerFlagsAnIncludeThatPointsUp) {
  EXPECT_EQ(violations_of("src/ops/cpu/x.cpp", "#include \"core/error.h\"\n#include \"kernels/train/loss_slots.h\"\n"
                                               "#include \"ops/ops.h\"\n#include <vector>\n"),
            std::vector<std::string>{});
  const std::vector<std::string> up = violations_of("src/ops/cpu/x.cpp", "\n  #include \"train/loss.h\"  // rows\n");
  ASSERT_EQ(up.size(), 1u);
  EXPECT_EQ(up[0], "src/ops/cpu/x.cpp:2: #include \"train/loss.h\": layer ops includes train, which sits above it");
  EXPECT_EQ(violations_of("kernels/train/k.cu", "#include \"model/drafter.h\"\n").size(), 1u);
  EXPECT_EQ(violations_of("src/comm/c.cpp", "#include \"pipeline/loops.h\"\n").size(), 1u);
  EXPECT_EQ(violations_of("src/core/c.cpp", "#include \"error.h\"\n").size(), 1u);  // not rooted
  EXPECT_EQ(violations_of("src/newlayer/n.cpp", "").size(), 1u);                    // a folder the table lacks
}
