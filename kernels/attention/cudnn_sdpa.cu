// cudnn_sdpa.h through cuDNN's backend graph API. The operation graph is the one cuDNN's fused
// flash-attention engines recognise (the decomposition the cuDNN frontend's composite SDPA node emits for
// cuDNN 9.x):
//   S = Q·Kᵀ (fp32) → × scale → padding mask (row < len_q and col < len_kv, else −inf) → causal mask (row ≥
//   col, else −inf) → softmax as max, subtract, exp, sum, divide (P in bf16) → O = P·V,
// with Q, K, V, O in cuDNN's ragged layout: dims [batch, heads, max_len, head dim] over the packed rows (K
// given transposed as [batch, kv heads, head dim, max_len] by its strides; GQA through the smaller kv head
// count), each sequence's first element at its ragged offset, lengths in the padding mask and the matmuls'
// M/N/K overrides. The batch is padded with empty sequences up to its power-of-two bucket. Plans are kept per
// (device, bucket, heads, head dim, row strides); the attention scale and −inf are passed by value at
// execution.
#include <cudnn_graph.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/attention/cudnn_sdpa.h"
#include "kernels/dispatch/dispatch.h"
#include "kernels/dispatch/measured.h"
#include "kernels/primitives/cuda_check.cuh"

namespace df {

namespace {

// The non-virtual tensors' unique ids; the graph's intermediate (virtual) tensors take ids from
// kFirstVirtual.
enum SdpaUid : int64_t {
  kUidQ = 1,
  kUidK,
  kUidV,
  kUidO,
  kUidSeqQ,
  kUidSeqKv,
  kUidOffQ,
  kUidOffK,
  kUidOffV,
  kUidOffO,
  kUidScale,
  kUidNegInfPad,
  kUidNegInfCausal,
  kUidCount = kUidNegInfCausal,
  kFirstVirtual = 100,
};

// Shortest sequence bucket: below it the plans would multiply for no gain (a flash tile is 64..128 rows).
constexpr int64_t kLenBucketLeast = 64;

[[noreturn]] void cudnn_fail(const std::string& node, const char* call, cudnnStatus_t st, int line) {
  char last[1024] = {0};
  cudnnGetLastErrorString(last, sizeof last);
  kernel_throw(__FILE__, line,
               "cuDNN attention, graph node \"" + node + "\": " + call + " returned " +
                   cudnnGetErrorString(st) + (last[0] ? std::string(": ") + last : std::string()) +
                   "; HINT: DFLASH_KERNEL_VARIANTS=attention=native runs this project's attention instead");
}

// A backend descriptor destroyed with its owner.
struct Desc {
  cudnnBackendDescriptor_t d = nullptr;
  Desc() = default;
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  Desc(Desc&& o) noexcept : d(std::exchange(o.d, nullptr)) {}
  ~Desc() {
    if (d) cudnnBackendDestroyDescriptor(d);
  }
};

struct Dims4 {
  int64_t v[4];
};

// The descriptors of one attention graph and its execution plan, built once and kept alive together.
class SdpaGraph {
 public:
  cudnnBackendDescriptor_t create(cudnnBackendDescriptorType_t type, const std::string& node) {
    Desc d;
    const cudnnStatus_t st = cudnnBackendCreateDescriptor(type, &d.d);
    if (st != CUDNN_STATUS_SUCCESS) cudnn_fail(node, "cudnnBackendCreateDescriptor", st, __LINE__);
    owned_.push_back(std::move(d));
    return owned_.back().d;
  }

  static void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t attr,
                  cudnnBackendAttributeType_t type, int64_t count, const void* value,
                  const std::string& node) {
    const cudnnStatus_t st = cudnnBackendSetAttribute(d, attr, type, count, value);
    if (st != CUDNN_STATUS_SUCCESS)
      cudnn_fail(node, ("cudnnBackendSetAttribute(" + std::to_string(int(attr)) + ")").c_str(), st, __LINE__);
  }

  static void finalize(cudnnBackendDescriptor_t d, const std::string& node) {
    const cudnnStatus_t st = cudnnBackendFinalize(d);
    if (st != CUDNN_STATUS_SUCCESS) cudnn_fail(node, "cudnnBackendFinalize", st, __LINE__);
  }

  // A 4-d tensor: `uid`, element type, dims and strides in elements, 16-byte alignment; virtual (an
  // intermediate no memory backs) or passed by value (a host scalar at execution); `ragged`: its per-batch
  // element offsets, or nullptr.
  cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t type, Dims4 dims, Dims4 strides,
                                  bool is_virtual, bool by_value, cudnnBackendDescriptor_t ragged,
                                  const std::string& name) {
    const std::string node = "tensor " + name;
    cudnnBackendDescriptor_t t = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR, node);
    const int64_t alignment = 16;
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, node);
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.v, node);
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.v, node);
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, node);
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, node);
    if (is_virtual) set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, node);
    if (by_value) set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, node);
    if (ragged) set(t, CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &ragged, node);
    finalize(t, node);
    return t;
  }

  // y = mode(x[, b[, t]]) elementwise with broadcasting, computed in `prec`; `axis` >= 0 for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t prec, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                 int64_t axis, const std::string& node) {
    cudnnBackendDescriptor_t pw = create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, node);
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, node);
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, node);
    if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, node);
    finalize(pw, node);
    cudnnBackendDescriptor_t op = create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, node);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw, node);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, node);
    if (b) set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, node);
    if (t) set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, node);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, node);
    const float one = 1.0f;
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, node);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, node);
    finalize(op, node);
    ops_.push_back(op);
  }

  // y = reduce(x) over the dims where y has extent 1, in fp32.
  void reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y,
                 const std::string& node) {
    cudnnBackendDescriptor_t r = create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, node);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, node);
    set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, node);
    finalize(r, node);
    cudnnBackendDescriptor_t op = create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, node);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r, node);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, node);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, node);
    finalize(op, node);
    ops_.push_back(op);
  }

  // c = a·b batched over the leading dims (fp32 accumulate); m, n, k: per-batch extents (the sequence
  // lengths) overriding the dims, or nullptr.
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c,
              cudnnBackendDescriptor_t m, cudnnBackendDescriptor_t n, cudnnBackendDescriptor_t k,
              const std::string& node) {
    cudnnBackendDescriptor_t mm = create(CUDNN_BACKEND_MATMUL_DESCRIPTOR, node);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, node);
    finalize(mm, node);
    cudnnBackendDescriptor_t op = create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, node);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, node);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, node);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, node);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm, node);
    if (m)
      set(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m, node);
    if (n)
      set(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, node);
    if (k)
      set(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &k, node);
    finalize(op, node);
    ops_.push_back(op);
  }

  // The operation graph of every op added, then an execution plan from the first engine configuration that
  // builds, in the order of cuDNN's heuristics (mode A, then its fallback list). Throws naming the last
  // status when none builds.
  void plan(cudnnHandle_t handle, const std::string& what) {
    const std::string node = "operation graph";
    cudnnBackendDescriptor_t graph = create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, node);
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(ops_.size()),
        ops_.data(), node);
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, node);
    finalize(graph, node);
    cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;
    int tried = 0;
    for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      const std::string hnode =
          mode == CUDNN_HEUR_MODE_A ? "engine heuristics (mode A)" : "engine heuristics (fallback)";
      Desc heur;
      cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur.d);
      if (st != CUDNN_STATUS_SUCCESS) cudnn_fail(hnode, "cudnnBackendCreateDescriptor", st, __LINE__);
      set(heur.d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph, hnode);
      set(heur.d, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, hnode);
      if ((st = cudnnBackendFinalize(heur.d)) != CUDNN_STATUS_SUCCESS) {
        last = st;
        continue;
      }
      int64_t count = 0;
      st = cudnnBackendGetAttribute(heur.d, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                    &count, nullptr);
      if (st != CUDNN_STATUS_SUCCESS) cudnn_fail(hnode, "cudnnBackendGetAttribute(results)", st, __LINE__);
      std::vector<Desc> cfgs(static_cast<size_t>(count));
      std::vector<cudnnBackendDescriptor_t> raw(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) {
        st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[size_t(i)].d);
        if (st != CUDNN_STATUS_SUCCESS)
          cudnn_fail(hnode, "cudnnBackendCreateDescriptor(engine config)", st, __LINE__);
        raw[size_t(i)] = cfgs[size_t(i)].d;
      }
      int64_t got = 0;
      st = cudnnBackendGetAttribute(heur.d, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                    count, &got, raw.data());
      if (st != CUDNN_STATUS_SUCCESS) cudnn_fail(hnode, "cudnnBackendGetAttribute(results)", st, __LINE__);
      for (int64_t i = 0; i < got; ++i, ++tried) {
        Desc p;
        st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p.d);
        if (st != CUDNN_STATUS_SUCCESS)
          cudnn_fail("execution plan", "cudnnBackendCreateDescriptor", st, __LINE__);
        set(p.d, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "execution plan");
        set(p.d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw[size_t(i)],
            "execution plan");
        if ((st = cudnnBackendFinalize(p.d)) != CUDNN_STATUS_SUCCESS) {
          last = st;
          continue;
        }
        int64_t ws = 0, n = 0;
        st = cudnnBackendGetAttribute(p.d, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                                      &ws);
        if (st != CUDNN_STATUS_SUCCESS)
          cudnn_fail("execution plan", "cudnnBackendGetAttribute(workspace)", st, __LINE__);
        workspace_ = size_t(ws);
        plan_ = p.d;
        owned_.push_back(std::move(p));
        owned_.push_back(std::move(cfgs[size_t(i)]));
        return;
      }
    }
    cudnn_fail("execution plan (" + what + ", " + std::to_string(tried) + " engine configurations tried)",
               "cudnnBackendFinalize", last, __LINE__);
  }

  cudnnBackendDescriptor_t plan_handle() const { return plan_; }
  size_t workspace() const { return workspace_; }

 private:
  std::vector<Desc> owned_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  cudnnBackendDescriptor_t plan_ = nullptr;
  size_t workspace_ = 0;
};

// (device, batch bucket, length bucket, hq, hkv, hd, ld_q, ld_k, ld_v, ld_out)
using SdpaKey = std::tuple<int, int64_t, int64_t, int, int, int, int64_t, int64_t, int64_t, int64_t>;

// The graph of one key: the ops in the order of the file comment.
std::unique_ptr<SdpaGraph> sdpa_build(cudnnHandle_t handle, const SdpaKey& key) {
  const int64_t b = std::get<1>(key), s = std::get<2>(key), hq = std::get<3>(key), hkv = std::get<4>(key),
                d = std::get<5>(key), ld_q = std::get<6>(key), ld_k = std::get<7>(key),
                ld_v = std::get<8>(key), ld_o = std::get<9>(key);
  auto g = std::make_unique<SdpaGraph>();
  int64_t uid = kFirstVirtual;
  const Dims4 one{{1, 1, 1, 1}}, per_seq{{b, 1, 1, 1}}, per_off{{b + 1, 1, 1, 1}};
  const Dims4 sd{{b, hq, s, s}}, ss{{hq * s * s, s * s, s, 1}}, rd{{b, hq, s, 1}}, rs{{hq * s, s, 1, 1}};
  auto io = [&](int64_t id, cudnnDataType_t t, Dims4 dims, Dims4 strides, cudnnBackendDescriptor_t ragged,
                const char* name) { return g->tensor(id, t, dims, strides, false, false, ragged, name); };
  auto scalar = [&](int64_t id, const char* name) {
    return g->tensor(id, CUDNN_DATA_FLOAT, one, one, false, true, nullptr, name);
  };
  auto virt = [&](cudnnDataType_t t, Dims4 dims, Dims4 strides, const char* name) {
    return g->tensor(uid++, t, dims, strides, true, false, nullptr, name);
  };
  const cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT, i32 = CUDNN_DATA_INT32,
                        i1 = CUDNN_DATA_BOOLEAN;

  auto off_q = io(kUidOffQ, CUDNN_DATA_INT64, per_off, one, nullptr, "Q ragged offsets");
  auto off_k = io(kUidOffK, CUDNN_DATA_INT64, per_off, one, nullptr, "K ragged offsets");
  auto off_v = io(kUidOffV, CUDNN_DATA_INT64, per_off, one, nullptr, "V ragged offsets");
  auto off_o = io(kUidOffO, CUDNN_DATA_INT64, per_off, one, nullptr, "O ragged offsets");
  auto q = io(kUidQ, bf, {{b, hq, s, d}}, {{s * ld_q, d, ld_q, 1}}, off_q, "Q");
  auto kt = io(kUidK, bf, {{b, hkv, d, s}}, {{s * ld_k, d, 1, ld_k}}, off_k, "K (as Kᵀ)");
  auto v = io(kUidV, bf, {{b, hkv, s, d}}, {{s * ld_v, d, ld_v, 1}}, off_v, "V");
  auto o = io(kUidO, bf, {{b, hq, s, d}}, {{s * ld_o, d, ld_o, 1}}, off_o, "O");
  auto len_q = io(kUidSeqQ, i32, per_seq, one, nullptr, "sequence lengths (q)");
  auto len_kv = io(kUidSeqKv, i32, per_seq, one, nullptr, "sequence lengths (kv)");
  auto scale = scalar(kUidScale, "attention scale");
  auto ninf_pad = scalar(kUidNegInfPad, "-inf (padding mask)");
  auto ninf_causal = scalar(kUidNegInfCausal, "-inf (causal mask)");

  auto s0 = virt(f32, sd, ss, "Q·Kᵀ");
  g->matmul(q, kt, s0, len_q, len_kv, nullptr, "bmm1 Q·Kᵀ");
  auto s1 = virt(f32, sd, ss, "scaled scores");
  g->pointwise(CUDNN_POINTWISE_MUL, f32, s0, scale, nullptr, s1, -1, "attention scale");

  auto row_p = virt(i32, sd, ss, "padding row index");
  g->pointwise(CUDNN_POINTWISE_GEN_INDEX, i32, s1, nullptr, nullptr, row_p, 2, "padding mask: row index");
  auto col_p = virt(i32, sd, ss, "padding column index");
  g->pointwise(CUDNN_POINTWISE_GEN_INDEX, i32, s1, nullptr, nullptr, col_p, 3, "padding mask: column index");
  auto row_in = virt(i1, sd, ss, "row < len_q");
  g->pointwise(CUDNN_POINTWISE_CMP_LT, i1, row_p, len_q, nullptr, row_in, -1, "padding mask: row < len_q");
  auto col_in = virt(i1, sd, ss, "column < len_kv");
  g->pointwise(CUDNN_POINTWISE_CMP_LT, i1, col_p, len_kv, nullptr, col_in, -1,
               "padding mask: column < len_kv");
  auto keep_p = virt(i1, sd, ss, "padding keep");
  g->pointwise(CUDNN_POINTWISE_LOGICAL_AND, i1, row_in, col_in, nullptr, keep_p, -1, "padding mask: and");
  auto s2 = virt(f32, sd, ss, "padded scores");
  g->pointwise(CUDNN_POINTWISE_BINARY_SELECT, f32, s1, ninf_pad, keep_p, s2, -1, "padding mask: select");

  auto row_c = virt(i32, sd, ss, "causal row index");
  g->pointwise(CUDNN_POINTWISE_GEN_INDEX, f32, s2, nullptr, nullptr, row_c, 2, "causal mask: row index");
  auto col_c = virt(i32, sd, ss, "causal column index");
  g->pointwise(CUDNN_POINTWISE_GEN_INDEX, f32, s2, nullptr, nullptr, col_c, 3, "causal mask: column index");
  auto keep_c = virt(i1, sd, ss, "row >= column");
  g->pointwise(CUDNN_POINTWISE_CMP_GE, i1, row_c, col_c, nullptr, keep_c, -1, "causal mask: row >= column");
  auto s3 = virt(f32, sd, ss, "masked scores");
  g->pointwise(CUDNN_POINTWISE_BINARY_SELECT, f32, s2, ninf_causal, keep_c, s3, -1, "causal mask: select");

  auto mx = virt(f32, rd, rs, "row max");
  g->reduction(CUDNN_REDUCE_TENSOR_MAX, s3, mx, "softmax: row max");
  auto s4 = virt(f32, sd, ss, "scores - max");
  g->pointwise(CUDNN_POINTWISE_SUB, f32, s3, mx, nullptr, s4, -1, "softmax: subtract max");
  auto s5 = virt(f32, sd, ss, "exp");
  g->pointwise(CUDNN_POINTWISE_EXP, f32, s4, nullptr, nullptr, s5, -1, "softmax: exp");
  auto sum = virt(f32, rd, rs, "row sum");
  g->reduction(CUDNN_REDUCE_TENSOR_ADD, s5, sum, "softmax: row sum");
  auto p = virt(bf, sd, ss, "P");
  g->pointwise(CUDNN_POINTWISE_DIV, f32, s5, sum, nullptr, p, -1, "softmax: divide");

  g->matmul(p, v, o, len_q, nullptr, len_kv, "bmm2 P·V");
  g->plan(handle, "batch " + std::to_string(b) + ", max_len " + std::to_string(s) + ", " +
                      std::to_string(hq) + "/" + std::to_string(hkv) + " heads of " + std::to_string(d));
  return g;
}

// Per-sequence lengths (0 for the bucket's padding sequences) and ragged offsets (the element offset of each
// sequence's first row in Q, K, V and O; the padding sequences start at the end).
__global__ void cudnn_sdpa_lens_kernel(const int32_t* cu, int b, int b_bucket, int64_t ld_q, int64_t ld_k,
                                       int64_t ld_v, int64_t ld_o, int32_t* lens, int64_t* off_q,
                                       int64_t* off_k, int64_t* off_v, int64_t* off_o) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i > b_bucket) return;
  const int64_t row = cu[min(i, b)];
  if (i < b_bucket) lens[i] = i < b ? cu[i + 1] - cu[i] : 0;
  off_q[i] = row * ld_q;
  off_k[i] = row * ld_k;
  off_v[i] = row * ld_v;
  off_o[i] = row * ld_o;
}

constexpr size_t align_up(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}

// Device memory of one (device, stream): cuDNN's workspace, then the lengths and the four offset arrays.
struct SdpaWorkspace {
  void* ptr = nullptr;
  size_t bytes = 0;
};

struct SdpaState {
  std::mutex mu;  // plans, workspaces and the handles (a cuDNN handle serves one call at a time)
  std::map<int, cudnnHandle_t> handles;
  std::map<SdpaKey, std::unique_ptr<SdpaGraph>> plans;
  std::map<std::pair<int, cudaStream_t>, SdpaWorkspace> workspaces;
};

// Never destroyed: at process exit cuDNN's own libraries may already be unloaded when a static destructor
// would release the plans and handles, and the process's memory goes back with it anyway.
SdpaState& state() {
  static SdpaState* s = new SdpaState;
  return *s;
}

// The handle of `dev` (created at its first use), or nullptr with the status where cuDNN cannot open one.
cudnnHandle_t sdpa_handle(int dev, cudnnStatus_t* status) {
  auto it = state().handles.find(dev);
  if (it != state().handles.end()) return it->second;
  cudnnHandle_t h = nullptr;
  *status = cudnnCreate(&h);
  if (*status != CUDNN_STATUS_SUCCESS) return nullptr;
  state().handles[dev] = h;
  return h;
}

}  // namespace

bool cudnn_sdpa_usable(std::string* why) {
  const size_t version = cudnnGetVersion();
  if (version < 90600) {
    if (why)
      *why =
          "cuDNN " + std::to_string(version) + " is loaded; the ragged attention layout needs 9.6 or newer";
    return false;
  }
  const int dev = cuda_current_device();
  std::lock_guard<std::mutex> lock(state().mu);
  cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
  if (!sdpa_handle(dev, &st)) {
    if (why)
      *why = std::string("cudnnCreate on device ") + std::to_string(dev) + " returned " +
             cudnnGetErrorString(st);
    return false;
  }
  return true;
}

void cudnn_sdpa_launch(const __nv_bfloat16* q, int64_t ld_q, const __nv_bfloat16* k, int64_t ld_k,
                       const __nv_bfloat16* v, int64_t ld_v, __nv_bfloat16* out, int64_t ld_out,
                       const int32_t* cu, int num_seqs, int max_len, int hq, int hkv, int hd, float scale,
                       cudaStream_t stream) {
  const int dev = cuda_current_device();
  const int64_t b = pow2_bucket(num_seqs, 1), s = pow2_bucket(max_len, kLenBucketLeast);
  const SdpaKey key{dev, b, s, hq, hkv, hd, ld_q, ld_k, ld_v, ld_out};
  std::lock_guard<std::mutex> lock(state().mu);
  cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
  cudnnHandle_t handle = sdpa_handle(dev, &st);
  if (!handle) cudnn_fail("handle", "cudnnCreate", st, __LINE__);
  auto found = state().plans.find(key);
  if (found == state().plans.end()) {
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<SdpaGraph> built = sdpa_build(handle, key);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    char line[256];
    std::snprintf(
        line, sizeof line,
        "cuDNN attention plan on device %d: batch <= %lld, longest sequence <= %lld, %d/%d heads of %d: "
        "built in %.1f ms, workspace %zu bytes",
        dev, (long long)b, (long long)s, hq, hkv, hd, ms, built->workspace());
    dispatch_log(line);
    found = state().plans.emplace(key, std::move(built)).first;
  }
  const SdpaGraph& g = *found->second;

  const size_t ws_bytes = align_up(g.workspace(), 256),
               lens_bytes = align_up(size_t(b) * sizeof(int32_t), 256),
               off_bytes = align_up(size_t(b + 1) * sizeof(int64_t), 256);
  const size_t need = ws_bytes + lens_bytes + 4 * off_bytes;
  SdpaWorkspace& w = state().workspaces[{dev, stream}];
  if (w.bytes < need) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    DF_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    if (capture != cudaStreamCaptureStatusNone)
      kernel_throw(
          __FILE__, __LINE__,
          "cuDNN attention: its workspace (" + std::to_string(need) +
              " bytes) must grow, which cannot happen while the stream is captured into a CUDA graph; "
              "HINT: run the call once before capturing it, or use DFLASH_KERNEL_VARIANTS=attention=native");
    if (w.ptr) DF_CUDA_CHECK(cudaFree(w.ptr));  // cudaFree waits for the work that still uses it
    w.ptr = nullptr, w.bytes = 0;
    DF_CUDA_CHECK(cudaMalloc(&w.ptr, need));
    w.bytes = need;
  }
  char* base = static_cast<char*>(w.ptr);
  int32_t* lens = reinterpret_cast<int32_t*>(base + ws_bytes);
  int64_t* offs = reinterpret_cast<int64_t*>(base + ws_bytes + lens_bytes);
  int64_t* off[4];
  for (int i = 0; i < 4; ++i)
    off[i] = reinterpret_cast<int64_t*>(reinterpret_cast<char*>(offs) + i * off_bytes);
  const int threads = 128, blocks = int((b + 1 + threads - 1) / threads);
  cudnn_sdpa_lens_kernel<<<blocks, threads, 0, stream>>>(cu, num_seqs, int(b), ld_q, ld_k, ld_v, ld_out, lens,
                                                         off[0], off[1], off[2], off[3]);
  DF_CUDA_CHECK_LAUNCH("cudnn_sdpa_lens_kernel");

  const float neg_inf = -INFINITY;
  int64_t uids[kUidCount] = {kUidQ,     kUidK,         kUidV,           kUidO,    kUidSeqQ,
                             kUidSeqKv, kUidOffQ,      kUidOffK,        kUidOffV, kUidOffO,
                             kUidScale, kUidNegInfPad, kUidNegInfCausal};
  void* ptrs[kUidCount] = {const_cast<__nv_bfloat16*>(q),
                           const_cast<__nv_bfloat16*>(k),
                           const_cast<__nv_bfloat16*>(v),
                           out,
                           lens,
                           lens,
                           off[0],
                           off[1],
                           off[2],
                           off[3],
                           &scale,
                           const_cast<float*>(&neg_inf),
                           const_cast<float*>(&neg_inf)};
  void* workspace = base;
  Desc pack;
  const std::string node = "variant pack";
  st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack.d);
  if (st != CUDNN_STATUS_SUCCESS) cudnn_fail(node, "cudnnBackendCreateDescriptor", st, __LINE__);
  SdpaGraph::set(pack.d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, kUidCount, uids, node);
  SdpaGraph::set(pack.d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, kUidCount, ptrs, node);
  SdpaGraph::set(pack.d, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace, node);
  SdpaGraph::finalize(pack.d, node);
  if ((st = cudnnSetStream(handle, stream)) != CUDNN_STATUS_SUCCESS)
    cudnn_fail("handle", "cudnnSetStream", st, __LINE__);
  if ((st = cudnnBackendExecute(handle, g.plan_handle(), pack.d)) != CUDNN_STATUS_SUCCESS)
    cudnn_fail("execution", "cudnnBackendExecute", st, __LINE__);
}

}  // namespace df
