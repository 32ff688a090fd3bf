// cuBLASLt GEMM for row-major operands. Row-major X is column-major Xᵀ, so c = a·wᵀ is computed as the
// column-major product cᵀ [N, M] = op_T(wᵀ) · aᵀ: A = w with TRANSA = T, B = a with TRANSB = N.
#include <map>
#include <tuple>

#include "kernels/cuda_check.cuh"
#include "kernels/gemm.cuh"

namespace df {

namespace {

using GemmKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int>;

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
  void* workspace = nullptr;
  size_t workspace_bytes = size_t(64) << 20;  // 64 MiB: what the split-K and stream-K kernels ask for on Hopper
  std::map<GemmKey, GemmPlan> plans;
};

GemmContext* gemm_init() {
  auto* ctx = new GemmContext();
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
  cublasLtDestroy(ctx->handle);
  delete ctx;
}

static GemmPlan& gemm_plan(GemmContext* ctx, const void* a, int64_t lda, const void* w, int64_t ldw, const void* c,
                           int64_t ldc, bool c_f32, int64_t M, int64_t N, int64_t K) {
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
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(ctx->handle, p.op, p.la, p.lb, p.lc, p.lc, pref, 1, &res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    char what[256];
    std::snprintf(what, sizeof(what), "no cuBLASLt algorithm for M=%lld N=%lld K=%lld lda=%lld ldw=%lld ldc=%lld (%s)",
                  (long long)M, (long long)N, (long long)K, (long long)lda, (long long)ldw, (long long)ldc,
                  cublasLtGetStatusString(st));
    cuda_throw("cublasLtMatmulAlgoGetHeuristic", what, __FILE__, __LINE__);
  }
  p.algo = res.algo;
  return ctx->plans.emplace(key, p).first->second;
}

void gemm_launch(GemmContext* ctx, const void* a, int64_t lda, const void* w, int64_t ldw, void* c, int64_t ldc,
                 bool c_f32, int64_t M, int64_t N, int64_t K, float beta, cudaStream_t stream) {
  if (M == 0 || N == 0) return;
  GemmPlan& p = gemm_plan(ctx, a, lda, w, ldw, c, ldc, c_f32, M, N, K);
  float alpha = 1.0f;
  DF_CUBLAS_CHECK(cublasLtMatmul(ctx->handle, p.op, &alpha, w, p.la, a, p.lb, &beta, c, p.lc, c, p.lc, &p.algo,
                                 ctx->workspace, ctx->workspace_bytes, stream));
}

}  // namespace df
