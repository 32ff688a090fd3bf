// cuBLASLt GEMM for row-major operands. Row-major X is column-major Xᵀ, so c = op(a)·op(b) is computed as the
// column-major product cᵀ [N, M] = op(b)ᵀ · op(a)ᵀ: cuBLAS's A is b (TRANSA = T when b is stored [N, K], the
// Linear weight of c = a·wᵀ), its B is a (TRANSB = T when a is stored [K, M], the dYᵀ of dW = dYᵀ·X).
// The first call of an M bucket times the heuristic's candidates on its own operands; other M reuse the pick.
// FP8 (gemm_fp8_launch): e4m3 operands in the same "TN" arrangement Hopper requires (cuBLAS's A, the weight,
// transposed), with cuBLASLt's outer-vector scales (per row of cuBLAS's A = per output channel, per column of
// its B = per token) applied to the fp32 accumulator in the epilogue; or, for a 128x128 block checkpoint
// (gemm_fp8_block_launch), one scale per 128x128 weight block and per token per 128 columns, applied per K
// block.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <tuple>

#include "kernels/dispatch/dispatch.h"
#include "kernels/gemm/gemm.cuh"
#include "kernels/primitives/cuda_check.cuh"
#include "kernels/train/train_workspace.h"

namespace df {

namespace {

// (M, N, K, lda, ldb, ldc, c is f32 | trans_a << 1 | trans_b << 2 | fp8 << 3 | fp8 blocks << 4, pointer
// alignment, batch count of a pointer-array GEMM or 0). A plan's key holds M and the batch count themselves;
// the tuned table's key holds gemm_m_bucket(M) (a pointer-array GEMM: M itself, which is its tile) and
// gemm_m_bucket(batch) in those slots.
using GemmKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int64_t>;

// Candidates asked of the heuristic: its first pick is an estimate, 0–12 % slower than the best of its list
// on the 27B/8B forward shapes (it returned 8 candidates for each of them on the H200, CUDA 13.0).
constexpr int kGemmCandidates = 16;
// Timed launches per candidate after one untimed one (which also loads the kernel's module).
constexpr int kGemmTuneReps = 2;
// A candidate replaces the heuristic's first only when it is at least 1 % faster: less is timing noise.
constexpr float kGemmSwitchRatio = 0.99f;
// Exact-shape plans kept before all are dropped. Packing to a token budget B yields up to B distinct M per
// weight shape over a run, so the plans would otherwise grow with the run's length. A plan is 4 cuBLASLt
// descriptors (host heap, well under 1 KiB), so 4096 stay under a few MiB; rebuilding one after the drop
// costs the layouts and one cublasLtMatmulAlgoCheck (microseconds, no timing: the tuned table is kept).
constexpr size_t kGemmMaxPlans = 4096;

struct GemmPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// The algorithm timed for one M bucket, and the M it was timed at (for the log).
struct GemmTuned {
  cublasLtMatmulAlgo_t algo{};
  int64_t m = 0;
};

// One call's operands: c [M, N] = alpha · op(a) · op(b) + beta · c_in, all row-major with row strides in
// elements; c_in is cuBLASLt's C, c its D (c_in has c's layout: nullptr means c itself).
struct GemmOperands {
  const void* a;
  int64_t lda;
  bool trans_a;
  const void* b;
  int64_t ldb;
  bool trans_b;
  void* c;
  int64_t ldc;
  bool c_f32;
  int64_t M, N, K;
  float alpha, beta;
  // FP8: a and b are e4m3 codes, scale_a [M] and scale_b [N] their outer-vector scales (device f32); with
  // fp8_blocks, scale_a VEC128 [ceil(K/128), M] (M a multiple of 4) and scale_b BLK128x128 (gemm.cuh
  // gemm_fp8_block_launch).
  bool fp8 = false;
  bool fp8_blocks = false;
  const float* scale_a = nullptr;
  const float* scale_b = nullptr;
  const void* c_in = nullptr;
  // Pointer-array batch (gemm_batched_launch): a, b and c are device arrays of `batch` matrix addresses, each
  // aligned to `align` bytes (the host cannot read them to find out).
  int64_t batch = 0;
  int align = 0;
  const void* addend() const { return c_in ? c_in : c; }
  int flags() const {
    return (c_f32 ? 1 : 0) | (trans_a ? 2 : 0) | (trans_b ? 4 : 0) | (fp8 ? 8 : 0) | (fp8_blocks ? 16 : 0);
  }
};

int ptr_alignment(const void* p) {
  return gemm_align_of(reinterpret_cast<uintptr_t>(p));
}

void gemm_destroy_plan(GemmPlan& p) {
  if (p.la) cublasLtMatrixLayoutDestroy(p.la);
  if (p.lb) cublasLtMatrixLayoutDestroy(p.lb);
  if (p.lc) cublasLtMatrixLayoutDestroy(p.lc);
  if (p.op) cublasLtMatmulDescDestroy(p.op);
  p = GemmPlan{};
}

}  // namespace

struct GemmContext {
  cublasLtHandle_t handle = nullptr;
  bool tune = true;  // false (registry gemm=heuristic): the heuristic's first algorithm, untimed (A/B timing)
  bool log = false;  // registry gemm=log: print the decision taken for every new shape
  void* workspace = nullptr;
  size_t workspace_bytes = kGemmWorkspaceBytes;
  // Output of the timed launches when beta != 0 (c must keep the values the real call adds to). Timing runs
  // once per M bucket, so new shapes keep arriving: the buffer only grows, and a shape no larger than one
  // seen before allocates nothing. It is bounded by the largest beta != 0 output, the target's residual
  // stream [T, hidden].
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  std::map<GemmKey, GemmPlan> plans;   // per exact shape: cuBLASLt layouts carry M; at most kGemmMaxPlans
  std::map<GemmKey, GemmTuned> tuned;  // per M bucket: about 4 per power of two of M per weight shape
  GemmStats stats;
};

int gemm_align_of(uint64_t v) {
  int a = 1;
  while (a < 256 && v % uint64_t(2 * a) == 0) a *= 2;
  return a;
}

int64_t gemm_m_bucket(int64_t m) {
  // cuBLASLt tiles M (the column count of cᵀ) in CTA tiles of 64–256 rows on Hopper, and which candidate
  // wins at a given N, K follows how many tiles and waves M makes and whether split-K pays, all of which
  // move gradually with M. A step of a quarter of M's power of two keeps the M of one bucket within a
  // quarter of that power of two (and within one 64-row tile) of the M that was timed, yet a run whose token
  // count spans 64..16384 tunes each weight shape at most 28 times instead of once per distinct count. Below
  // 64 rows M is one tile and the GEMM is bound by reading the N×K weight, so one timing serves all of them.
  int64_t pow2 = 1;
  while (pow2 <= m / 2) pow2 *= 2;
  const int64_t step = std::max<int64_t>(64, pow2 / 4);
  return (m + step - 1) / step * step;
}

GemmContext* gemm_init() {
  auto* ctx = new GemmContext();
  ctx->tune = !kernel_variants().gemm_heuristic;
  ctx->log = kernel_variants().gemm_log;
  DF_CUBLAS_CHECK(cublasLtCreate(&ctx->handle));
  DF_CUDA_CHECK(cudaMalloc(&ctx->workspace, ctx->workspace_bytes));
  return ctx;
}

static void gemm_clear_plans(GemmContext* ctx) {
  for (auto& [key, p] : ctx->plans) gemm_destroy_plan(p);
  ctx->plans.clear();
}

void gemm_free(GemmContext* ctx) {
  if (!ctx) return;
  gemm_clear_plans(ctx);
  cudaFree(ctx->workspace);
  cudaFree(ctx->scratch);
  cublasLtDestroy(ctx->handle);
  delete ctx;
}

GemmStats gemm_stats(const GemmContext* ctx) {
  GemmStats s = ctx->stats;
  s.plans = static_cast<int64_t>(ctx->plans.size());
  s.buckets = static_cast<int64_t>(ctx->tuned.size());
  return s;
}

// The tuning scratch grown to at least `bytes`, or nullptr where the memory is not there (the caller then
// skips timing). Freeing the smaller buffer first keeps the peak at the new size.
static void* gemm_scratch(GemmContext* ctx, size_t bytes) {
  if (bytes <= ctx->scratch_bytes) return ctx->scratch;
  DF_CUDA_CHECK(cudaFree(ctx->scratch));
  ctx->scratch = nullptr;
  ctx->scratch_bytes = 0;
  if (cudaMalloc(&ctx->scratch, bytes) != cudaSuccess) {
    cudaGetLastError();
    ctx->scratch = nullptr;
    return nullptr;
  }
  ctx->scratch_bytes = bytes;
  return ctx->scratch;
}

// Times the candidates that fit the workspace and returns the index of the fastest that ran (0, the
// heuristic's first, unless another beats it by kGemmSwitchRatio), or -1 where nothing was timed: tuning
// off, a single candidate, a stream under graph capture, no memory for the scratch output. The timed
// launches compute the real product into c when beta == 0 (the real call overwrites it next); with
// beta != 0 they read and write a scratch buffer (as cuBLASLt's C and D), so c and c_in keep the values the
// real call adds.
static int gemm_time_candidates(GemmContext* ctx, const GemmPlan& p, const cublasLtMatmulHeuristicResult_t* res,
                                int found, const GemmOperands& o, cudaStream_t stream) {
  const int64_t M = o.M, N = o.N, K = o.K, ldc = o.ldc;
  const bool c_f32 = o.c_f32;
  const float beta = o.beta;
  if (!ctx->tune || found < 2) return -1;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) {
    cudaGetLastError();
    return -1;
  }
  void* out = o.c;
  if (beta != 0.0f) {
    const size_t bytes = gemm_tune_scratch_bytes(M, N, ldc, c_f32);
    out = gemm_scratch(ctx, bytes);
    if (!out) return -1;
    DF_CUDA_CHECK(cudaMemsetAsync(out, 0, bytes, stream));
  }
  cudaEvent_t ev[2];
  DF_CUDA_CHECK(cudaEventCreate(&ev[0]));
  DF_CUDA_CHECK(cudaEventCreate(&ev[1]));
  const float alpha = o.alpha;
  float first_ms = -1.0f, best_ms = -1.0f;
  int best = 0;
  for (int i = 0; i < found; ++i) {
    if (res[i].state != CUBLAS_STATUS_SUCCESS || res[i].workspaceSize > ctx->workspace_bytes) continue;
    auto launch = [&] {
      return cublasLtMatmul(ctx->handle, p.op, &alpha, o.b, p.la, o.a, p.lb, &beta, out, p.lc, out, p.lc, &res[i].algo,
                            ctx->workspace, ctx->workspace_bytes, stream);
    };
    if (launch() != CUBLAS_STATUS_SUCCESS) continue;
    bool ok = cudaEventRecord(ev[0], stream) == cudaSuccess;
    for (int r = 0; r < kGemmTuneReps && ok; ++r) ok = launch() == CUBLAS_STATUS_SUCCESS;
    ok = ok && cudaEventRecord(ev[1], stream) == cudaSuccess;
    // A failed synchronisation is a kernel fault that poisons the context: report it rather than go on.
    DF_CUDA_CHECK(cudaEventSynchronize(ev[1]));
    float ms = 0.0f;
    if (!ok || cudaEventElapsedTime(&ms, ev[0], ev[1]) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    if (i == 0) first_ms = ms;
    if (best_ms < 0.0f || ms < best_ms) {
      best_ms = ms;
      best = i;
    }
  }
  cudaEventDestroy(ev[0]);
  cudaEventDestroy(ev[1]);
  if (best_ms < 0.0f) return -1;
  if (first_ms >= 0.0f && best != 0 && best_ms > kGemmSwitchRatio * first_ms) best = 0;
  if (ctx->log)
    std::printf("gemm M=%lld N=%lld K=%lld: tuned for M bucket %lld, candidate %d of %d, %.3f ms vs first %.3f ms\n",
                (long long)M, (long long)N, (long long)K, (long long)gemm_m_bucket(M), best, found,
                (best == 0 ? first_ms : best_ms) / kGemmTuneReps, first_ms / kGemmTuneReps);
  return best;
}

// The operation and layouts of one exact shape; the algorithm is filled in by the caller.
static GemmPlan gemm_create_plan(const GemmOperands& o) {
  GemmPlan p;
  DF_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = o.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, tb = o.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  DF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  DF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  cudaDataType_t ct = o.c_f32 ? CUDA_R_32F : CUDA_R_16BF, it = o.fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  const int64_t M = o.M, N = o.N, K = o.K, ldc = o.ldc;
  if (o.fp8) {
    // cuBLAS's A is our b (scale per output channel n, or per weight block), its B our a (per token, or per
    // token per 128 columns).
    const int32_t mode_a = o.fp8_blocks ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                        : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F,
                  mode_b = o.fp8_blocks ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                                        : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    DF_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof(mode_a)));
    DF_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof(mode_b)));
  }
  // Column-major shapes of the stored operands: b is [N, K] row-major when trans_b, else [K, N].
  if (o.trans_b)
    DF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.la, it, K, N, o.ldb));
  else
    DF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.la, it, N, K, o.ldb));
  if (o.trans_a)
    DF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lb, it, M, K, o.lda));
  else
    DF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lb, it, K, M, o.lda));
  DF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lc, ct, N, M, ldc));
  if (o.batch > 0) {
    const int32_t count = static_cast<int32_t>(o.batch);
    const uint32_t mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
    for (cublasLtMatrixLayout_t l : {p.la, p.lb, p.lc}) {
      DF_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      DF_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof(mode)));
    }
  }
  return p;
}

// Up to `want` of the heuristic's candidates for the plan's shape under the workspace and the operands'
// alignment; returns how many it gave. None destroys the plan and is fatal, the shape reported.
static int gemm_heuristic(GemmContext* ctx, GemmPlan& p, int align, int want, cublasLtMatmulHeuristicResult_t* res,
                          const GemmOperands& o) {
  cublasLtMatmulPreference_t pref;
  DF_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = ctx->workspace_bytes;
  uint32_t al = static_cast<uint32_t>(align);
  DF_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    DF_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof(al)));
  int found = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(ctx->handle, p.op, p.la, p.lb, p.lc, p.lc, pref, want, res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    gemm_destroy_plan(p);
    char what[400];
    std::snprintf(
        what, sizeof(what),
        "no cuBLASLt algorithm for M=%lld N=%lld K=%lld lda=%lld%s ldb=%lld%s ldc=%lld%s%s beta=%g "
        "align=%d%s (%s)",
        (long long)o.M, (long long)o.N, (long long)o.K, (long long)o.lda, o.trans_a ? " (trans)" : "",
        (long long)o.ldb, o.trans_b ? " (trans)" : "", (long long)o.ldc, o.c_f32 ? " f32" : "",
        !o.fp8         ? ""
        : o.fp8_blocks ? " e4m3 with 1x128 / 128x128 block scales (HINT: needs sm_90 and cuBLAS >= 12.9)"
                       : " e4m3 with outer-vector scales (HINT: FP8 needs sm_90 and cuBLAS >= 12.9)",
        o.beta, align, o.batch > 0 ? " pointer-array batch (the MoE experts' grouped GEMM)" : "",
        cublasLtGetStatusString(st));
    cuda_throw("cublasLtMatmulAlgoGetHeuristic", what, __FILE__, __LINE__);
  }
  return found;
}

// Whether an algorithm tuned at another M of the bucket runs this exact shape: cublasLtMatmulAlgoCheck
// refuses e.g. a tile or split-K configuration the new M does not support, and reports the workspace the
// algorithm needs at this M (split-K's grows with M). Alignment needs no check: it is part of the bucket key.
static bool gemm_algo_fits(GemmContext* ctx, const GemmPlan& p, const cublasLtMatmulAlgo_t& algo,
                           std::string* why) {
  cublasLtMatmulHeuristicResult_t r{};
  cublasStatus_t st = cublasLtMatmulAlgoCheck(ctx->handle, p.op, p.la, p.lb, p.lc, p.lc, &algo, &r);
  if (st == CUBLAS_STATUS_SUCCESS) st = r.state;
  if (st != CUBLAS_STATUS_SUCCESS) {
    *why = cublasLtGetStatusString(st);
    return false;
  }
  if (r.workspaceSize > ctx->workspace_bytes) {
    *why = "needs " + std::to_string(r.workspaceSize) + " bytes of workspace";
    return false;
  }
  return true;
}

// The FP8 scale vectors of this call: they differ per weight, so they are set on the cached descriptor before
// every launch (a host-side attribute write).
static void gemm_bind_scales(const GemmPlan& p, const GemmOperands& o) {
  if (!o.fp8) return;
  DF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &o.scale_b,
                                                 sizeof(o.scale_b)));
  DF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &o.scale_a,
                                                 sizeof(o.scale_a)));
}

// The plan of this exact shape, created (and its bucket tuned) on first use.
static GemmPlan& gemm_plan(GemmContext* ctx, const GemmOperands& o, cudaStream_t stream) {
  const int64_t M = o.M, N = o.N, K = o.K;
  const int align =
      o.batch > 0
          ? o.align
          : std::min({ptr_alignment(o.a), ptr_alignment(o.b), ptr_alignment(o.c), ptr_alignment(o.addend())});
  const GemmKey key{M, N, K, o.lda, o.ldb, o.ldc, o.flags(), align, o.batch};
  auto it = ctx->plans.find(key);
  if (it != ctx->plans.end()) return it->second;

  if (ctx->plans.size() >= kGemmMaxPlans) {
    if (ctx->log) std::printf("gemm: %zu shapes cached, plans dropped (tuned algorithms kept)\n", ctx->plans.size());
    gemm_clear_plans(ctx);
  }
  GemmPlan p = gemm_create_plan(o);
  gemm_bind_scales(p, o);
  const int64_t bucket = o.batch > 0 ? M : gemm_m_bucket(M);
  const GemmKey tkey{
      bucket, N, K, o.lda, o.ldb, o.ldc, o.flags(), align, o.batch > 0 ? gemm_m_bucket(o.batch) : 0};
  cublasLtMatmulHeuristicResult_t res[kGemmCandidates]{};
  auto t = ctx->tuned.find(tkey);
  if (t != ctx->tuned.end()) {
    std::string why;
    if (gemm_algo_fits(ctx, p, t->second.algo, &why)) {
      p.algo = t->second.algo;
      ++ctx->stats.reused;
      if (ctx->log)
        std::printf("gemm M=%lld N=%lld K=%lld: reuses the algorithm tuned at M=%lld (bucket %lld)\n", (long long)M,
                    (long long)N, (long long)K, (long long)t->second.m, (long long)bucket);
    } else {
      // Timing again would cost what the bucket exists to save; the heuristic's pick is 0–12 % off the best.
      gemm_heuristic(ctx, p, align, 1, res, o);
      p.algo = res[0].algo;
      ++ctx->stats.rejected;
      if (ctx->log)
        std::printf("gemm M=%lld N=%lld K=%lld: algorithm tuned at M=%lld refused (%s), heuristic's first pick\n",
                    (long long)M, (long long)N, (long long)K, (long long)t->second.m, why.c_str());
    }
  } else {
    const int found = gemm_heuristic(ctx, p, align, kGemmCandidates, res, o);
    const int best = gemm_time_candidates(ctx, p, res, found, o, stream);
    if (best >= 0) {
      p.algo = res[best].algo;
      ctx->tuned.emplace(tkey, GemmTuned{p.algo, M});
      ++ctx->stats.tuned;
    } else {
      // No bucket entry: the next new M of this bucket tries the timing again (e.g. outside graph capture).
      p.algo = res[0].algo;
      ++ctx->stats.untimed;
      if (ctx->log)
        std::printf("gemm M=%lld N=%lld K=%lld: heuristic's first of %d, not timed\n", (long long)M, (long long)N,
                    (long long)K, found);
    }
  }
  return ctx->plans.emplace(key, p).first->second;
}

static void gemm_run(GemmContext* ctx, const GemmPlan& p, const GemmOperands& o, cudaStream_t stream) {
  gemm_bind_scales(p, o);
  DF_CUBLAS_CHECK(cublasLtMatmul(ctx->handle, p.op, &o.alpha, o.b, p.la, o.a, p.lb, &o.beta, o.addend(), p.lc,
                                 o.c, p.lc, &p.algo, ctx->workspace, ctx->workspace_bytes, stream));
}

// c [M, N] = beta·c, beta 0 without reading c: the GEMM of K = 0, which cuBLASLt is not asked to run (it may
// leave c as it is). Block (x, y): 256 columns of rows y, y + gridDim.y, ...
__global__ void gemm_scale_c_kernel(void* c, int64_t ldc, bool c_f32, int64_t M, int64_t N, float beta) {
  const int64_t col = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= N) return;
  for (int64_t r = blockIdx.y; r < M; r += gridDim.y) {
    if (c_f32) {
      float* cr = static_cast<float*>(c) + r * ldc + col;
      *cr = beta == 0.0f ? 0.0f : beta * *cr;
    } else {
      __nv_bfloat16* cr = static_cast<__nv_bfloat16*>(c) + r * ldc + col;
      *cr = __float2bfloat16_rn(beta == 0.0f ? 0.0f : beta * __bfloat162float(*cr));
    }
  }
}

void gemm_launch_ex(GemmContext* ctx, const void* a, int64_t lda, bool trans_a, const void* b, int64_t ldb,
                    bool trans_b, void* c, int64_t ldc, bool c_f32, int64_t M, int64_t N, int64_t K, float alpha,
                    float beta, cudaStream_t stream) {
  gemm_launch_addend(ctx, a, lda, trans_a, b, ldb, trans_b, c, ldc, c, ldc, c_f32, M, N, K, alpha, beta,
                     stream);
}

void gemm_launch_addend(GemmContext* ctx, const void* a, int64_t lda, bool trans_a, const void* b,
                        int64_t ldb, bool trans_b, const void* c_in, int64_t ld_c_in, void* c, int64_t ldc,
                        bool c_f32, int64_t M, int64_t N, int64_t K, float alpha, float beta,
                        cudaStream_t stream) {
  if (M == 0 || N == 0) return;
  GemmOperands o{a, lda, trans_a, b, ldb, trans_b, c, ldc, c_f32, M, N, K, alpha, beta};
  // beta 0 never reads the addend. Another row stride than c's, or K = 0 (no cuBLASLt call), has it copied
  // into c first: cuBLASLt's C and D share one layout here (the plan holds one).
  if (beta != 0.0f && c_in != c) {
    if (ld_c_in == ldc && K > 0) {
      o.c_in = c_in;
    } else {
      const size_t es = c_f32 ? sizeof(float) : sizeof(__nv_bfloat16);
      DF_CUDA_CHECK(cudaMemcpy2DAsync(c, size_t(ldc) * es, c_in, size_t(ld_c_in) * es, size_t(N) * es,
                                      size_t(M), cudaMemcpyDeviceToDevice, stream));
    }
  }
  if (K == 0) {
    // An empty row range of dW = beta·dW + dYᵀ·X (a micro-batch without context rows): c = beta·c, so a
    // step's first write (beta 0) still leaves zeros.
    if (beta == 1.0f) return;
    const dim3 grid(unsigned((N + 255) / 256), unsigned(std::min<int64_t>(M, 65535)));
    gemm_scale_c_kernel<<<grid, 256, 0, stream>>>(c, ldc, c_f32, M, N, beta);
    DF_CUDA_CHECK_LAUNCH("gemm_scale_c_kernel");
    return;
  }
  gemm_run(ctx, gemm_plan(ctx, o, stream), o, stream);
}

void gemm_launch(GemmContext* ctx, const void* a, int64_t lda, const void* w, int64_t ldw, void* c, int64_t ldc,
                 bool c_f32, int64_t M, int64_t N, int64_t K, float beta, cudaStream_t stream) {
  gemm_launch_ex(ctx, a, lda, false, w, ldw, true, c, ldc, c_f32, M, N, K, 1.0f, beta, stream);
}

void gemm_batched_launch(GemmContext* ctx, const void* const* a, int64_t lda, const void* const* w,
                         int64_t ldw, void* const* c, int64_t ldc, int64_t M, int64_t N, int64_t K,
                         int64_t batch, int align, cudaStream_t stream) {
  if (M == 0 || N == 0 || batch == 0) return;
  DF_CHECK(
      K > 0 && batch <= INT32_MAX && align >= 2 && (align & (align - 1)) == 0,
      "gemm_batched: M=%lld N=%lld K=%lld batch %lld align %d: K and the batch (< 2^31) must be positive, "
      "align a power of two >= 2",
      (long long)M, (long long)N, (long long)K, (long long)batch, align);
  GemmOperands o{a, lda, false, w, ldw, true, const_cast<void**>(c), ldc, false, M, N, K, 1.0f, 0.0f};
  o.batch = batch;
  o.align = align;
  gemm_run(ctx, gemm_plan(ctx, o, stream), o, stream);
}

// c [M, N] = bf16(f32(c) + d) (add) or bf16(d), d f32 with rows ldd: the block GEMM's tail rows (at most 3,
// their product computed in the scratch) stored into c, rounded once. Block (x, y): 256 columns of row y.
__global__ void gemm_store_f32_kernel(__nv_bfloat16* c, int64_t ldc, const float* d, int64_t ldd, int64_t N,
                                      bool add) {
  const int64_t col = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, r = blockIdx.y;
  if (col >= N) return;
  __nv_bfloat16* cr = c + r * ldc + col;
  *cr = __float2bfloat16_rn((add ? __bfloat162float(*cr) : 0.0f) + d[r * ldd + col]);
}

static void gemm_store_f32(void* c, int64_t ldc, const float* d, int64_t ldd, int64_t M, int64_t N, bool add,
                           cudaStream_t stream) {
  const dim3 grid(unsigned((N + 255) / 256), unsigned(M));
  gemm_store_f32_kernel<<<grid, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(c), ldc, d, ldd, N, add);
  DF_CUDA_CHECK_LAUNCH("gemm_store_f32_kernel");
}

// Both FP8 entry points past their operands: the shape rule Hopper's FP8 kernels have, then cuBLASLt.
static void gemm_fp8_run(GemmContext* ctx, const GemmOperands& o, cudaStream_t stream) {
  const int64_t M = o.M, N = o.N, K = o.K;
  if (M == 0 || N == 0) return;
  // Hopper's FP8 tensor-core kernels read K in 16-byte steps: K and both row strides multiples of 16, rows
  // 16-byte aligned. The target refuses other shapes when it loads (naming the tensor); this names the call.
  const bool ok = K % 16 == 0 && o.lda % 16 == 0 && o.ldb % 16 == 0 && ptr_alignment(o.a) >= 16 &&
                  ptr_alignment(o.b) >= 16;
  DF_CHECK(ok,
           "gemm_fp8: M=%lld N=%lld K=%lld ldx=%lld ldw=%lld, x %% 16 = %d, w %% 16 = %d: FP8 GEMMs need K, "
           "the row strides and the row addresses multiples of 16 bytes",
           (long long)M, (long long)N, (long long)K, (long long)o.lda, (long long)o.ldb,
           int(reinterpret_cast<uintptr_t>(o.a) % 16), int(reinterpret_cast<uintptr_t>(o.b) % 16));
  // beta 1 (the residual add) runs in cuBLASLt's own epilogue. On the H200 (cuBLASLt 13.1) its FP8 kernels round
  // the scaled product to bf16 before adding c (test_fp8_cuda bounds exactly that), which is what the HF peer
  // computes: its o_proj / down_proj output is a bf16 tensor that the residual add then adds, rounding again.
  // An f32 product in the scratch plus an add kernel rounds once instead, but cost 5 % of a 27B forward.
  DF_CHECK(o.beta == 0.0f || o.beta == 1.0f, "gemm_fp8: beta %g: 0, or 1 for the residual add", o.beta);
  gemm_run(ctx, gemm_plan(ctx, o, stream), o, stream);
}

void gemm_fp8_launch(GemmContext* ctx, const uint8_t* x, int64_t ldx, const float* scale_x, const uint8_t* w,
                     int64_t ldw, const float* scale_w, void* c, int64_t ldc, int64_t M, int64_t N, int64_t K,
                     float beta, cudaStream_t stream) {
  GemmOperands o{x, ldx, false, w, ldw, true, c, ldc, false, M, N, K, 1.0f, beta};
  o.fp8 = true;
  o.scale_a = scale_x;
  o.scale_b = scale_w;
  gemm_fp8_run(ctx, o, stream);
}

void gemm_fp8_block_launch(GemmContext* ctx, const uint8_t* x, int64_t ldx, const float* scale_x,
                           const uint8_t* w, int64_t ldw, const float* scale_w, void* c, int64_t ldc,
                           int64_t M, int64_t N, int64_t K, float beta, cudaStream_t stream) {
  GemmOperands o{x, ldx, false, w, ldw, true, c, ldc, false, M, N, K, 1.0f, beta};
  o.fp8 = true;
  o.fp8_blocks = true;
  o.scale_a = scale_x;
  o.scale_b = scale_w;
  // cuBLASLt runs VEC128 scales only for a multiple of 4 rows (core/fp8.h fp8_group_scale_index): the first
  // rows4 rows as they are, the last M - rows4 copied into a zero-padded 4-row operand in the scratch, its
  // product in f32 there, then stored into c with one rounding.
  DF_CHECK(beta == 0.0f || beta == 1.0f, "gemm_fp8_block: beta %g: 0 or 1 (the residual add)", beta);
  const int64_t rows4 = M & ~int64_t(3), tail = M - rows4;
  o.M = rows4;
  gemm_fp8_run(ctx, o, stream);
  if (tail == 0) return;
  const int64_t kpad = (K + 255) & ~int64_t(255);
  uint8_t* s = static_cast<uint8_t*>(gemm_scratch(ctx, size_t(4 * kpad) + size_t(4 * N) * sizeof(float)));
  DF_CHECK(s != nullptr, "gemm_fp8_block: no device memory for the %lld-row tail", (long long)tail);
  DF_CUDA_CHECK(cudaMemsetAsync(s, 0, size_t(4 * kpad), stream));
  DF_CUDA_CHECK(cudaMemcpy2DAsync(s, size_t(kpad), x + rows4 * ldx, size_t(ldx), size_t(K), size_t(tail),
                                  cudaMemcpyDeviceToDevice, stream));
  float* d = reinterpret_cast<float*>(s + 4 * kpad);
  GemmOperands ot = o;
  ot.a = s;
  ot.lda = kpad;
  ot.M = 4;
  ot.scale_a = scale_x + ((K + 127) / 128) * rows4;
  ot.c = d;
  ot.ldc = N;
  ot.c_f32 = true;
  ot.beta = 0.0f;
  gemm_fp8_run(ctx, ot, stream);
  gemm_store_f32(static_cast<__nv_bfloat16*>(c) + rows4 * ldc, ldc, d, N, tail, N, beta != 0.0f, stream);
}

}  // namespace df
