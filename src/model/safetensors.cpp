// safetensors reading (memory-mapped, every header field checked against the file) and atomic writing.
// Checkpoints are tens of GB, so tensors stay in the page cache and are handed out as pointers into the map.
#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/file_util.h"

namespace df {

// One read-only mapping of a whole file; unmapped when the index that owns it goes away.
class StMapping {
 public:
  StMapping(const std::string& path) : path_(path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) DF_FAIL("cannot open safetensors file %s: %s", path.c_str(), std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      int e = errno;
      ::close(fd);
      DF_FAIL("cannot stat %s: %s", path.c_str(), std::strerror(e));
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      int e = errno;
      ::close(fd);
      if (p == MAP_FAILED) DF_FAIL("cannot mmap %s (%zu bytes): %s", path.c_str(), size_, std::strerror(e));
      base_ = static_cast<const uint8_t*>(p);
    } else {
      ::close(fd);
    }
  }
  ~StMapping() {
    if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
  }
  StMapping(const StMapping&) = delete;
  StMapping& operator=(const StMapping&) = delete;

  const uint8_t* base() const { return base_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
};

namespace {

bool st_parse_dtype(const std::string& s, DType* out) {
  static const std::pair<const char*, DType> table[] = {
      {"F32", DType::f32}, {"BF16", DType::bf16}, {"F16", DType::f16},        {"I32", DType::i32},
      {"I64", DType::i64}, {"U8", DType::u8},     {"F8_E4M3", DType::f8_e4m3}};
  for (const auto& [name, t] : table)
    if (s == name) {
      *out = t;
      return true;
    }
  return false;
}

const char* st_dtype_tag(DType t) {
  switch (t) {
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
    case DType::i32:
      return "I32";
    case DType::i64:
      return "I64";
    case DType::u8:
      return "U8";
    case DType::f8_e4m3:
      return "F8_E4M3";
  }
  return "?";
}

bool path_exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

// Multiplies shape entries, refusing negatives and products that overflow int64.
int64_t st_shape_numel(const std::vector<int64_t>& shape, const std::string& what) {
  int64_t n = 1;
  for (int64_t d : shape) {
    DF_CHECK(d >= 0, "%s: negative dimension %lld in shape", what.c_str(), static_cast<long long>(d));
    DF_CHECK(d == 0 || n <= INT64_MAX / d, "%s: shape product overflows", what.c_str());
    n *= d;
  }
  return n;
}

// Parses the header of one mapped file and adds its tensors to `out` (names must be new).
void st_read_header(const StMapping& m, std::map<std::string, StTensor>& out) {
  const std::string& path = m.path();
  DF_CHECK(m.size() >= 8, "%s: truncated safetensors file (%zu bytes, the 8-byte header length is missing)",
           path.c_str(), m.size());
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | m.base()[i];
  DF_CHECK(hlen <= m.size() - 8,
           "%s: corrupt or truncated safetensors file: header length %llu exceeds the %zu bytes after it",
           path.c_str(), static_cast<unsigned long long>(hlen), m.size() - 8);
  const char* hbegin = reinterpret_cast<const char*>(m.base() + 8);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(hbegin, hbegin + hlen);
  } catch (const nlohmann::json::exception& e) {
    DF_FAIL("%s: corrupt safetensors header (not valid JSON: %s)", path.c_str(), e.what());
  }
  DF_CHECK(header.is_object(), "%s: corrupt safetensors header (top level is not a JSON object)",
           path.c_str());

  const uint8_t* data = m.base() + 8 + hlen;
  const uint64_t data_size = m.size() - 8 - hlen;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string what = strfmt("%s: tensor '%s'", path.c_str(), name.c_str());
    DF_CHECK(entry.is_object(), "%s: header entry is not an object", what.c_str());
    auto dt = entry.find("dtype");
    auto sh = entry.find("shape");
    auto off = entry.find("data_offsets");
    DF_CHECK(dt != entry.end() && dt->is_string(), "%s: missing or non-string 'dtype'", what.c_str());
    DF_CHECK(sh != entry.end() && sh->is_array(), "%s: missing or non-array 'shape'", what.c_str());
    DF_CHECK(off != entry.end() && off->is_array() && off->size() == 2 && (*off)[0].is_number_unsigned() &&
                 (*off)[1].is_number_unsigned(),
             "%s: 'data_offsets' must be two non-negative integers", what.c_str());

    StTensor t;
    t.name = name;
    t.file = path;
    const std::string dts = dt->get<std::string>();
    DF_CHECK(st_parse_dtype(dts, &t.dtype),
             "%s: unsupported dtype '%s' (supported: F32, BF16, F16, I32, I64, U8, F8_E4M3); convert the "
             "checkpoint",
             what.c_str(), dts.c_str());
    for (const auto& d : *sh) {
      DF_CHECK(d.is_number_integer(), "%s: shape entries must be integers", what.c_str());
      t.shape.push_back(d.get<int64_t>());
    }
    const int64_t numel = st_shape_numel(t.shape, what);
    const uint64_t begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
    DF_CHECK(
        begin <= end && end <= data_size,
        "%s: bad data_offsets [%llu, %llu]: the data section holds %llu bytes (file truncated or corrupt)",
        what.c_str(), static_cast<unsigned long long>(begin), static_cast<unsigned long long>(end),
        static_cast<unsigned long long>(data_size));
    t.nbytes = static_cast<size_t>(end - begin);
    const uint64_t want = static_cast<uint64_t>(numel) * dtype_size(t.dtype);
    DF_CHECK(t.nbytes == want, "%s: data_offsets span %zu bytes but shape × %s needs %llu", what.c_str(),
             t.nbytes, dts.c_str(), static_cast<unsigned long long>(want));
    t.data = data + begin;
    DF_CHECK(out.find(name) == out.end(), "%s: tensor name appears in two files (also in %s)", what.c_str(),
             out.at(name).file.c_str());
    out.emplace(name, std::move(t));
  }
}

std::string path_join(const std::string& dir, const std::string& name) {
  if (!dir.empty() && dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

}  // namespace

std::string st_shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

int64_t StTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsIndex::SafetensorsIndex() = default;
SafetensorsIndex::~SafetensorsIndex() = default;
SafetensorsIndex::SafetensorsIndex(SafetensorsIndex&&) noexcept = default;
SafetensorsIndex& SafetensorsIndex::operator=(SafetensorsIndex&&) noexcept = default;

SafetensorsIndex SafetensorsIndex::open(const std::string& path) {
  SafetensorsIndex idx;
  DF_CHECK(path_exists(path),
           "checkpoint path %s does not exist (expected a directory with model.safetensors "
           "or model.safetensors.index.json, or a .safetensors file)",
           path.c_str());
  if (!path_is_dir(path)) {
    idx.files_.push_back(std::make_unique<StMapping>(path));
    st_read_header(*idx.files_.back(), idx.tensors_);
    return idx;
  }

  const std::string index_path = path_join(path, "model.safetensors.index.json");
  const std::string single_path = path_join(path, "model.safetensors");
  if (!path_exists(index_path)) {
    DF_CHECK(path_exists(single_path),
             "checkpoint directory %s holds neither model.safetensors.index.json nor "
             "model.safetensors; point at the directory the weights were downloaded to",
             path.c_str());
    idx.files_.push_back(std::make_unique<StMapping>(single_path));
    st_read_header(*idx.files_.back(), idx.tensors_);
    return idx;
  }

  nlohmann::json index;
  {
    std::ifstream in(index_path);
    DF_CHECK(in.good(), "cannot read %s", index_path.c_str());
    try {
      index = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      DF_FAIL("%s: not valid JSON: %s", index_path.c_str(), e.what());
    }
  }
  auto wm = index.find("weight_map");
  DF_CHECK(wm != index.end() && wm->is_object(), "%s: missing or non-object 'weight_map'",
           index_path.c_str());
  // Shards in first-seen order, each mapped once however many tensors name it.
  std::vector<std::string> shards;
  std::set<std::string> seen;
  for (const auto& [name, shard] : wm->items()) {
    DF_CHECK(shard.is_string(), "%s: weight_map['%s'] is not a file name", index_path.c_str(), name.c_str());
    const std::string s = shard.get<std::string>();
    if (seen.insert(s).second) shards.push_back(s);
  }
  for (const std::string& s : shards) {
    const std::string shard_path = path_join(path, s);
    DF_CHECK(path_exists(shard_path), "%s lists shard %s but %s does not exist (incomplete download?)",
             index_path.c_str(), s.c_str(), shard_path.c_str());
    idx.files_.push_back(std::make_unique<StMapping>(shard_path));
    st_read_header(*idx.files_.back(), idx.tensors_);
  }
  for (const auto& [name, shard] : wm->items()) {
    auto it = idx.tensors_.find(name);
    const std::string shard_path = path_join(path, shard.get<std::string>());
    DF_CHECK(it != idx.tensors_.end() && it->second.file == shard_path,
             "%s says tensor '%s' is in %s, but that shard does not hold it", index_path.c_str(),
             name.c_str(), shard_path.c_str());
  }
  return idx;
}

const StTensor* SafetensorsIndex::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> SafetensorsIndex::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& kv : tensors_) out.push_back(kv.first);
  return out;
}

void st_to_f32(const StTensor& t, float* out) {
  const int64_t n = t.numel();
  DF_CHECK(static_cast<size_t>(n) * dtype_size(t.dtype) == t.nbytes,
           "tensor '%s' in %s: %zu bytes for %lld %s", t.name.c_str(), t.file.c_str(), t.nbytes,
           static_cast<long long>(n), dtype_name(t.dtype));
  // memcpy per element: tensors inside a foreign file need not be aligned for their type.
  const uint8_t* p = static_cast<const uint8_t*>(t.data);
  switch (t.dtype) {
    case DType::f32:
      std::memcpy(out, p, t.nbytes);
      return;
    case DType::bf16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = bf16_to_f32(h);
      }
      return;
    case DType::f16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = f16_to_f32(h);
      }
      return;
    case DType::i32:
      for (int64_t i = 0; i < n; ++i) {
        int32_t v;
        std::memcpy(&v, p + 4 * i, 4);
        out[i] = static_cast<float>(v);
      }
      return;
    case DType::i64:
      for (int64_t i = 0; i < n; ++i) {
        int64_t v;
        std::memcpy(&v, p + 8 * i, 8);
        out[i] = static_cast<float>(v);
      }
      return;
    case DType::u8:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(p[i]);
      return;
    case DType::f8_e4m3:
      // Block-scaled FP8 codes mean nothing without their weight_scale_inv (model/fp8_weights.h).
      DF_FAIL(
          "tensor '%s' in %s is F8_E4M3: it needs its block scale to be read; HINT: only target "
          "checkpoint linear weights may be FP8 (dequantised by the target loader)",
          t.name.c_str(), t.file.c_str());
  }
}

void safetensors_write(const std::string& path, const std::vector<StWriteTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // Header entries in the caller's order so the file reads in the same order the data is laid out.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json md = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) md[k] = v;
    header["__metadata__"] = md;
  }
  uint64_t offset = 0;
  std::set<std::string> names;
  std::vector<size_t> sizes;
  for (const StWriteTensor& t : tensors) {
    DF_CHECK(!t.name.empty() && t.name != "__metadata__", "%s: invalid tensor name '%s'", path.c_str(),
             t.name.c_str());
    DF_CHECK(names.insert(t.name).second, "%s: tensor '%s' given twice", path.c_str(), t.name.c_str());
    const uint64_t nbytes = static_cast<uint64_t>(st_shape_numel(
                                t.shape, strfmt("%s: tensor '%s'", path.c_str(), t.name.c_str()))) *
                            dtype_size(t.dtype);
    DF_CHECK(nbytes == 0 || t.data != nullptr, "%s: tensor '%s' has no data", path.c_str(), t.name.c_str());
    header[t.name] = {
        {"dtype", st_dtype_tag(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    sizes.push_back(static_cast<size_t>(nbytes));
  }
  std::string hjson = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned, as the reference writer does.
  hjson.append((8 - hjson.size() % 8) % 8, ' ');
  uint8_t hlen[8];
  for (int i = 0; i < 8; ++i) hlen[i] = static_cast<uint8_t>(static_cast<uint64_t>(hjson.size()) >> (8 * i));

  std::vector<FilePart> parts{{hlen, 8, "the header"}, {hjson.data(), hjson.size(), "the header"}};
  for (size_t i = 0; i < tensors.size(); ++i)
    parts.push_back({tensors[i].data, sizes[i], "tensor '" + tensors[i].name + "'"});
  file_write_atomic(path, parts);
}

}  // namespace df
