// Hopper warpgroup MMA (wgmma, sm_90a) wrappers: shared-memory matrix descriptors for the 128-byte swizzled
// layout and the shapes the attention kernels issue: one template per operand form (both operands in shared
// memory; A in registers, B transposed), specialized per n, because every accumulator register has to be its
// own operand of the asm statement; the operand lists are built once below.
// Layout contract (PTX ISA, "matrix descriptor"): a tile row is 64 bf16 = 128 bytes; 16-byte chunk c of row r
// sits at chunk c ^ (r % 8); 8-row atoms of 1024 bytes; tile bases 1024-byte aligned.
#pragma once
#include <cstdint>

#include "kernels/primitives/arch_asm.cuh"

namespace df {

// start address, leading / stride byte offsets (16-byte units), 128-byte swizzle (mode 1 in bits 62-63).
__device__ __forceinline__ uint64_t wgmma_desc(const void* smem, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo_bytes >> 4) << 16) |
         (static_cast<uint64_t>(sbo_bytes >> 4) << 32) | (1ull << 62);
}

// K-step kk (16 columns) of a 64-row tile of HD columns in the layout above (HD / 64 column blocks of
// 64 rows × 128 bytes, 8 KB apart), read K-major as the A or B operand of an m64nNk16 A·Bᵀ.
__device__ __forceinline__ uint64_t wgmma_desc_k(const void* tile, int kk) {
  return wgmma_desc(static_cast<const unsigned char*>(tile) + (kk >> 2) * (64 * 128) + (kk & 3) * 32, 16, 1024);
}

// K-step kk (16 rows) of the same tile read as a transposed (MN-major) B operand: its rows are the k index,
// its columns the n index (two 8-row atoms per step, column blocks 8 KB apart).
__device__ __forceinline__ uint64_t wgmma_desc_t(const void* tile, int kk) {
  return wgmma_desc(static_cast<const unsigned char*>(tile) + kk * 2048, 64 * 128, 1024);
}


__device__ __forceinline__ void wgmma_fence() { DF_WGMMA_ASM("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { DF_WGMMA_ASM("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { DF_WGMMA_ASM("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Waits until at most N committed groups of this thread are still in flight (groups complete in order).
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  DF_WGMMA_ASM("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving reads or writes of accumulator registers across a wgmma wait.
template <int N>
__device__ __forceinline__ void wgmma_fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// The same for an A fragment in registers: keeps it live, and unmodified, until the wgmma reading it is waited
// for (the compiler sees the wgmma read it at issue and would otherwise reuse the registers at once).
template <int N>
__device__ __forceinline__ void wgmma_fence_regs(uint32_t (&a)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(a[i])::"memory");
}

// The accumulator operands of the shapes below, n / 2 fp32 registers a thread: the register list of the
// instruction text and the "+f" operand list, each built on the next smaller one.
#define DF_WGMMA_REGS32 \
    "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15" "," \
    "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define DF_WGMMA_REGS40 \
    DF_WGMMA_REGS32 "," \
    "%32,%33,%34,%35,%36,%37,%38,%39"
#define DF_WGMMA_REGS64 \
    DF_WGMMA_REGS40 "," \
    "%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55" "," \
    "%56,%57,%58,%59,%60,%61,%62,%63"
#define DF_WGMMA_REGS128 \
    DF_WGMMA_REGS64 "," \
    "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79" "," \
    "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95" "," \
    "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111" "," \
    "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
#define DF_WGMMA_D32 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define DF_WGMMA_D40 \
    DF_WGMMA_D32, \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
#define DF_WGMMA_D64 \
    DF_WGMMA_D40, \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define DF_WGMMA_D128 \
    DF_WGMMA_D64, \
    "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
    "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
    "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
    "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
    "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
    "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
    "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
    "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

// D[64×N] (+)= A·Bᵀ with A [64 × 16] and B [N × 16] both K-major in shared memory; accumulate = 0
// overwrites D. Shapes: N 64, 80, 128 (WgmmaSs<N>::mma below).
template <int N>
struct WgmmaSs;
// D[64×N] += A·B with A [64 × 16] in registers (each warp's 16 rows as the m16n8k16 A fragment) and B
// [16 × N] MN-major (transposed) in shared memory. Shapes: N 128, 256.
template <int N>
struct WgmmaRsTb;

// One specialization per shape: the instruction's n, the accumulator lists and the first input's operand
// number (the accumulators are operands 0 .. N/2 − 1).
#define DF_WGMMA_SS(N, REGS, DLIST, A, B, ACC)                                                               \
  template <>                                                                                               \
  struct WgmmaSs<N> {                                                                                       \
    static __device__ __forceinline__ void mma(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,         \
                                               int accumulate) {                                            \
      DF_WGMMA_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %" #ACC ", 0;\n"                                       \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 {" REGS "}, %" #A ", %" #B         \
                   ", p, 1, 1, 0, 0;\n}\n"                                                                     \
                   : DLIST                                                                                  \
                   : "l"(desc_a), "l"(desc_b), "r"(accumulate));                                            \
    }                                                                                                       \
  };
#define DF_WGMMA_RS_TB(N, REGS, DLIST, A0, A1, A2, A3, B)                                                     \
  template <>                                                                                               \
  struct WgmmaRsTb<N> {                                                                                     \
    static __device__ __forceinline__ void mma(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b) { \
      DF_WGMMA_ASM("{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"                                               \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 {" REGS "}, {%" #A0 ",%" #A1     \
                   ",%" #A2 ",%" #A3 "}, %" #B ", p, 1, 1, 1;\n}\n"                                            \
                   : DLIST                                                                                  \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));                              \
    }                                                                                                       \
  };
DF_WGMMA_SS(64, DF_WGMMA_REGS32, DF_WGMMA_D32, 32, 33, 34)
DF_WGMMA_SS(80, DF_WGMMA_REGS40, DF_WGMMA_D40, 40, 41, 42)
DF_WGMMA_SS(128, DF_WGMMA_REGS64, DF_WGMMA_D64, 64, 65, 66)
DF_WGMMA_RS_TB(128, DF_WGMMA_REGS64, DF_WGMMA_D64, 64, 65, 66, 67, 68)
DF_WGMMA_RS_TB(256, DF_WGMMA_REGS128, DF_WGMMA_D128, 128, 129, 130, 131, 132)
#undef DF_WGMMA_SS
#undef DF_WGMMA_RS_TB

template <int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  WgmmaSs<N>::mma(d, desc_a, desc_b, accumulate);
}
template <int N>
__device__ __forceinline__ void wgmma_rs_tb(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b) {
  WgmmaRsTb<N>::mma(d, a, desc_b);
}

}  // namespace df
