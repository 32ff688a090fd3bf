// cuBLASLt GEMM for row-major operands. Row-major X is column-major Xᵀ, so c = a·wᵀ is computed as the
// column-major product cᵀ [N, M] = op_T(wᵀ) · aᵀ: A = w with TRANSA = T, B = a with TRANSB = N.
// The first call of a shape times the heuristic's candidates on its own operands and keeps the fastest.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <tuple>

#include "kernels/cuda_check.cuh"
#include "kernels/gemm.cuh"

namespace df {

namespace {

using GemmKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int>;

// Candidates asked of the heuristic: its first pick is an estimate, 0–12 % slower than the best of its list
// on the 27B/8B forward shapes (it returned 8 candidates for each of them on the H200, CUDA 13.0).
constexpr int kGemmCandidates = 16;
// Timed launches per candidate after one untimed one (which also loads the kernel's module).
constexpr int kGemmTuneReps = 2;
// A candidate replaces the heuristic's first only when it is at least 1 % faster: less is timing noise.
constexpr float kGemmSwitchRatio = 0.99f;

struct GemmPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// Largest power of two (≤ 256) dividing the address: cuBLASLt picks vectorised kernels from it.
int ptr_alignment(const void* p) {
  uintptr_t u = reinterpret_cast<uintptr_t>(p);
  int a = 1;
  while (a < 256 && (u % (2 * a)) == 0) a *= 2;
  return a;
}

}  // namespace

struct GemmContext {
  cublasLtHandle_t handle = nullptr;
  bool tune = true;  // DFLASH_GEMM_TUNE=0 keeps the heuristic's first algorithm (for A/B timing)
  bool log = false;  // DFLASH_GEMM_LOG=1 prints the pick of every new shape
  void* workspace = nullptr;
  size_t workspace_bytes = size_t(64) << 20;  // 64 MiB: what the split-K and stream-K kernels ask for on Hopper
  // Output of the timed launches when beta != 0 (c must keep the values the real call adds to). The target's
  // token count changes from batch to batch, so new shapes keep arriving: the buffer only grows, and a shape
  // no larger than one seen before allocates nothing. It is bounded by the largest beta != 0 output, the
  // target's residual stream [T, hidden].
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  std::map<GemmKey, GemmPlan> plans;
};

GemmContext* gemm_init() {
  auto* ctx = new GemmContext();
  const char* tune = std::getenv("DFLASH_GEMM_TUNE");
  const char* log = std::getenv("DFLASH_GEMM_LOG");
  ctx->tune = !(tune && std::string(tune) == "0");
  ctx->log = log && std::string(log) == "1";
  DF_CUBLAS_CHECK(cublasLtCreate(&ctx->handle));
  DF_CUDA_CHECK(cudaMalloc(&ctx->workspace, ctx->workspace_bytes));
  return ctx;
}

void gemm_free(GemmContext* ctx) {
  if (!ctx) return;
  for (auto& [key, p] : ctx->plans) {
    cublasLtMatrixLayoutDestroy(p.la);
    cublasLtMatrixLayoutDestroy(p.lb);
    cublasLtMatrixLayoutDestroy(p.lc);
    cublasLtMatmulDescDestroy(p.op);
  }
  cudaFree(ctx->workspace);
  cudaFree(ctx->scratch);
  cublasLtDestroy(ctx->handle);
  delete ctx;
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

// Times the candidates that fit the workspace and returns the fastest that ran, or the heuristic's first
// where timing is impossible (a stream under graph capture, no memory for the scratch output) or no
// candidate beats it by kGemmSwitchRatio. The timed launches compute the real product into c when
// beta == 0 (the real call overwrites it next); with beta != 0 they write a scratch buffer so c keeps the
// values the real call adds to.
static cublasLtMatmulAlgo_t gemm_pick_algo(GemmContext* ctx, const GemmPlan& p,
                                           const cublasLtMatmulHeuristicResult_t* res, int found, const void* a,
                                           const void* w, void* c, int64_t ldc, bool c_f32, int64_t M, int64_t N,
                                           int64_t K, float beta, cudaStream_t stream) {
  if (!ctx->tune || found < 2) return res[0].algo;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) {
    cudaGetLastError();
    return res[0].algo;
  }
  void* out = c;
  if (beta != 0.0f) {
    // The span of c in elements, last row cut at N: what a [M, N] view with row stride ldc touches.
    const size_t bytes = size_t((M - 1) * ldc + N) * (c_f32 ? 4 : 2);
    out = gemm_scratch(ctx, bytes);
    if (!out) return res[0].algo;
    DF_CUDA_CHECK(cudaMemsetAsync(out, 0, bytes, stream));
  }
  cudaEvent_t ev[2];
  DF_CUDA_CHECK(cudaEventCreate(&ev[0]));
  DF_CUDA_CHECK(cudaEventCreate(&ev[1]));
  const float alpha = 1.0f;
  float first_ms = -1.0f, best_ms = -1.0f;
  int best = 0;
  for (int i = 0; i < found; ++i) {
    if (res[i].state != CUBLAS_STATUS_SUCCESS || res[i].workspaceSize > ctx->workspace_bytes) continue;
    auto launch = [&] {
      return cublasLtMatmul(ctx->handle, p.op, &alpha, w, p.la, a, p.lb, &beta, out, p.lc, out, p.lc, &res[i].algo,
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
  if (best_ms < 0.0f) return res[0].algo;
  if (first_ms >= 0.0f && best != 0 && best_ms > kGemmSwitchRatio * first_ms) best = 0;
  if (ctx->log)
    std::printf("gemm M=%lld N=%lld K=%lld: candidate %d of %d, %.3f ms vs heuristic's first %.3f ms\n", (long long)M,
             (long long)N, (long long)K, best, found, (best == 0 ? first_ms : best_ms) / kGemmTuneReps,
             first_ms / kGemmTuneReps);
  return res[best].algo;
}

static GemmPlan& gemm_plan(GemmContext* ctx, const void* a, int64_t lda, const void* w, int64_t ldw, void* c,
                           int64_t ldc, bool c_f32, int64_t M, int64_t N, int64_t K, float beta, cudaStream_t stream) {
  int align = std::min(std::min(ptr_alignment(a), ptr_alignment(w)), ptr_alignment(c));
  GemmKey key{M, N, K, lda, ldw, ldc, c_f32 ? 1 : 0, align};
  auto it = ctx->plans.find(key);
  if (it != ctx->plans.end()) return it->second;

  GemmPlan p;
  DF_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  DF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  DF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  cudaDataType_t ct = c_f32 ? CUDA_R_32F : CUDA_R_16BF;
  DF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.la, CUDA_R_16BF, K, N, ldw));
  DF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lb, CUDA_R_16BF, K, M, lda));
  DF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lc, ct, N, M, ldc));

  cublasLtMatmulPreference_t pref;
  DF_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = ctx->workspace_bytes;
  uint32_t al = static_cast<uint32_t>(align);
  DF_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    DF_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof(al)));
  cublasLtMatmulHeuristicResult_t res[kGemmCandidates]{};
  int found = 0;
  cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(ctx->handle, p.op, p.la, p.lb, p.lc, p.lc, pref, kGemmCandidates, res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    char what[256];
    std::snprintf(what, sizeof(what), "no cuBLASLt algorithm for M=%lld N=%lld K=%lld lda=%lld ldw=%lld ldc=%lld (%s)",
                  (long long)M, (long long)N, (long long)K, (long long)lda, (long long)ldw, (long long)ldc,
                  cublasLtGetStatusString(st));
    cuda_throw("cublasLtMatmulAlgoGetHeuristic", what, __FILE__, __LINE__);
  }
  p.algo = gemm_pick_algo(ctx, p, res, found, a, w, c, ldc, c_f32, M, N, K, beta, stream);
  return ctx->plans.emplace(key, p).first->second;
}

void gemm_launch(GemmContext* ctx, const void* a, int64_t lda, const void* w, int64_t ldw, void* c, int64_t ldc,
                 bool c_f32, int64_t M, int64_t N, int64_t K, float beta, cudaStream_t stream) {
  if (M == 0 || N == 0) return;
  GemmPlan& p = gemm_plan(ctx, a, lda, w, ldw, c, ldc, c_f32, M, N, K, beta, stream);
  float alpha = 1.0f;
  DF_CUBLAS_CHECK(cublasLtMatmul(ctx->handle, p.op, &alpha, w, p.la, a, p.lb, &beta, c, p.lc, c, p.lc, &p.algo,
                                 ctx->workspace, ctx->workspace_bytes, stream));
}

}  // namespace df
