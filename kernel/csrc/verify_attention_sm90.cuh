// Verify attention main kernel for sm_90a (H100/H200): wgmma (warpgroup MMA) with both operands
// read by the tensor cores straight from shared memory. Torch-free; the plan (computed by each CTA
// at its start), the combine kernel and the work-item helpers are shared with the mma.sync kernel
// (verify_attention.cuh).
//
// CTA = 2 warpgroups (256 threads) over M = 64 rows (draft token x head pairs), KV tiles of 64
// keys, 2 cp.async stages. Per tile:
//   S = Q K^T     each warpgroup computes S for its 32 of the 64 keys over all 576 dims
//                 (36 x wgmma m64n32k16; Q and K both from shared memory);
//   softmax       the two warpgroups swap row maxima through shared memory, so both scale with the
//                 same running max; each writes its bf16 probabilities into the P tile;
//   O += P V      each warpgroup owns 256 of the 512 output dims (64 x 256 fp32 = 128 registers
//                 per thread) and multiplies all 64 keys of P by its half of V
//                 (4 x wgmma m64n256k16, V read in place from the KV tile, MN-major).
// Shared memory holds Q, the KV stages and P in the canonical 128-byte-swizzled layout that wgmma
// descriptors address: 64-dim chunks of [rows][128 B], 16-byte unit u of row r stored at unit
// u ^ (r % 8), every chunk 1024-byte aligned.
#pragma once

#include "verify_attention.cuh"

namespace va {

struct ConfigWgmma {
  static constexpr int kM = 64;
  static constexpr int kBlockN = 64;
  static constexpr int kStages = 2;
  static constexpr int kMinSplitKeys = 128;  // a split holds at least this many keys (kernel/NOTES.md, v21)
  static constexpr int kThreads = 256;
  static constexpr int kChunkBytes = 64 * 128;              // 64 rows x 64 dims (128 B) = 8 swizzle atoms
  static constexpr int kChunks = kQKDim / 64;               // 9 chunks per 576-dim row block
  static constexpr int kTileBytes = kChunks * kChunkBytes;  // 72 KB: Q, or one KV stage
  static constexpr int kQOff = 0;
  static constexpr int kKVOff = kTileBytes;
  static constexpr int kPOff = kKVOff + kStages * kTileBytes;  // P: one chunk (64 rows x 64 keys)
  static constexpr int kRedOff = kPOff + kChunkBytes;          // [2 warpgroups][64 rows] floats
  static constexpr int kSmemUsed = kRedOff + 2 * 64 * 4;
  static constexpr int kSmemBytes = kSmemUsed + 1024;          // slack to align the base to 1024 B
};

// One row of 576 bf16 (72 units of 16 B) copied by 4 threads: thread `sub` copies units
// sub + 4 i, i < 18. Unit sub + 4 i sits in chunk i / 2 at swizzled position (sub + 4 (i % 2)) ^ (r % 8),
// so two base offsets plus constants address all 18 (few registers live across the loop).
__device__ __forceinline__ void copy_row_swizzled(uint32_t dst_block, int r, int sub, const __nv_bfloat16* src,
                                                  bool valid) {
  const uint32_t even = dst_block + r * 128 + ((sub ^ (r & 7)) << 4);
  const uint32_t odd = dst_block + r * 128 + (((sub + 4) ^ (r & 7)) << 4);
#pragma unroll
  for (int i = 0; i < kChunksPerRow / 4; ++i) {
    const uint32_t dst = ((i & 1) ? odd : even) + (i >> 1) * ConfigWgmma::kChunkBytes;
    cp_async_16_shared(dst, src + (valid ? (sub + 4 * i) * 8 : 0), valid);
  }
}

__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v));
}

// wgmma shared-memory matrix descriptor, 128-byte swizzle (PTX ISA, "Matrix Descriptor Format"):
// bits 0-13 start address >> 4, 16-29 leading byte offset >> 4, 32-45 stride byte offset >> 4,
// 62-63 swizzle mode (1 = 128 B). K-major operands: the stride byte offset is the step between
// 8-row groups (1024 B); the leading offset is unused. MN-major (V): the leading offset is the
// step between 64-element blocks along N (one chunk), the stride offset between 8-row K groups.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Generic-proxy writes to shared memory (cp.async, st.shared) -> visible to wgmma's async proxy.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Pins accumulator registers in program order: the compiler may not move reads of them above a
// wgmma wait, nor writes below a wgmma issue.
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N][4]) {
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}

// D[64 x 32] (+)= A[64 x 16] B[16 x 32]; A and B K-major in shared memory.
__device__ __forceinline__ void wgmma_m64n32k16(float (&d)[4][4], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
// D[64 x 32] (+)= A[64 x 16] B[16 x 32]; A from registers (per warp the m16n8k16 A fragment of
// its 16 rows: a0 (row g, k 2t..2t+1), a1 (row g + 8), a2 (row g, k + 8), a3 (row g + 8, k + 8),
// g = lane / 4, t = lane % 4), B K-major in shared memory.
__device__ __forceinline__ void wgmma_m64n32k16_rs(float (&d)[4][4], const uint32_t (&a)[4], uint64_t desc_b,
                                                   int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}
// The same two shapes for 48-key tiles (D[64 x 48], 24 accumulators a thread).
__device__ __forceinline__ void wgmma_m64n48k16(float (&d)[6][4], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %26, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, "
      "%24, %25, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
__device__ __forceinline__ void wgmma_m64n48k16_rs(float (&d)[6][4], const uint32_t (&a)[4], uint64_t desc_b,
                                                   int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %29, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, "
      "{%24, %25, %26, %27}, %28, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}
// S tile shapes by key count: kNT n8 tiles (32 or 48 keys).
template <int kNT>
__device__ __forceinline__ void wgmma_qk_ss(float (&d)[kNT][4], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  if constexpr (kNT == 4) wgmma_m64n32k16(d, desc_a, desc_b, scale_d);
  else wgmma_m64n48k16(d, desc_a, desc_b, scale_d);
}
template <int kNT>
__device__ __forceinline__ void wgmma_qk_rs(float (&d)[kNT][4], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
  if constexpr (kNT == 4) wgmma_m64n32k16_rs(d, a, desc_b, scale_d);
  else wgmma_m64n48k16_rs(d, a, desc_b, scale_d);
}
// D[64 x 256] (+)= A[64 x 16] B[16 x 256]; A K-major, B MN-major (transposed) in shared memory.
__device__ __forceinline__ void wgmma_m64n256k16_vmn(float (&d)[32][4], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, p, 1, 1, 0, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
        "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
        "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]),
        "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]),
        "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]),
        "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]),
        "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]),
        "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]),
        "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]),
        "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]),
        "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]),
        "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]),
        "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]),
        "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]),
        "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]),
        "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]),
        "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]),
        "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]),
        "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
// O (rows r_lo, r_lo + 8 of a 64 x 256 accumulator) times the rows' rescale factors. Skipped when
// no row of the warp moved its max (alpha == 1 exactly): multiplying by 1 is the identity, so the
// result is bitwise the same (kernel/NOTES.md, v4 experiments).
__device__ __forceinline__ void rescale_o_lazy(float (&o)[32][4], float alpha_lo, float alpha_hi) {
  if (__any_sync(0xffffffffu, alpha_lo != 1.f || alpha_hi != 1.f))
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      o[j][0] *= alpha_lo;
      o[j][1] *= alpha_lo;
      o[j][2] *= alpha_hi;
      o[j][3] *= alpha_hi;
    }
}

// The tile steps of the main kernel, also driven on their own by the wgmma probe test
// (tests/wgmma_probe.cu), which checks them against torch matmuls.

// S[64 x 32] = Q K^T for keys [32 wg, 32 wg + 32) of the KV tile at sK, over all 576 dims:
// 36 wgmma m64n32k16 (qk_tile_issue), waited for by qk_tile_wait. Descriptors advance by adding
// to the start-address field (16-byte units): 32 B per 16-dim k-step inside a chunk, one chunk
// per 64 dims. The chunk loop stays rolled so the 36 descriptors are not all held in registers.
__device__ __forceinline__ void qk_tile_issue(float (&s)[4][4], uint32_t sQ, uint32_t sK, int wg) {
  constexpr int kChunk = ConfigWgmma::kChunkBytes;
  wgmma_fence();
  const uint64_t qa = smem_desc(sQ, 16, 1024), kb = smem_desc(sK + wg * 32 * 128, 16, 1024);
#pragma unroll 1
  for (int c = 0; c < ConfigWgmma::kChunks; ++c) {
    const uint64_t step = static_cast<uint64_t>(c * (kChunk >> 4));
#pragma unroll
    for (int k = 0; k < 4; ++k) wgmma_m64n32k16(s, qa + step + 2 * k, kb + step + 2 * k, c > 0 || k > 0);
  }
  wgmma_commit();
}
__device__ __forceinline__ void qk_tile_wait(float (&s)[4][4]) {
  wgmma_wait<0>();
  fence_regs(s);
}
__device__ __forceinline__ void qk_tile(float (&s)[4][4], uint32_t sQ, uint32_t sK, int wg) {
  qk_tile_issue(s, sQ, sK, wg);
  qk_tile_wait(s);
}

// Two bf16 probabilities (keys `key`, `key` + 1; key even) of row r into the P tile: one chunk,
// 64 rows x 64 keys, 128-byte swizzled like every operand.
__device__ __forceinline__ void store_p_pair(uint32_t sP, int r, int key, uint32_t packed) {
  st_shared_b32(sP + r * 128 + ((((key >> 3) ^ (r & 7))) << 4) + (key & 7) * 2, packed);
}

// Two 16-key column blocks of a warp's 16 rows of P (keys 16 jj .. 16 jj + 15) with one
// stmatrix: registers {rows 0-7, keys 8 (2 jj)}, {rows 8-15, same keys}, then the next 8 keys, each
// in the accumulator layout (row lane / 4, keys 2 (lane % 4), +1), i.e. pk[2 jj][0..1], pk[2 jj + 1][0..1].
// Lane l gives the address of row l % 8 (+8 for l / 8 odd) of 8-key block 2 jj + l / 16, swizzled like
// store_p_pair: one address per lane instead of one per stored word.
__device__ __forceinline__ void store_p_x4(uint32_t sP, int warp_row0, int jj, int lane, uint32_t a0, uint32_t a1,
                                           uint32_t a2, uint32_t a3) {
  const int r = warp_row0 + (lane & 7) + ((lane >> 3) & 1) * 8, kb = 2 * jj + (lane >> 4);
  const uint32_t addr = sP + r * 128 + ((kb ^ (r & 7)) << 4);
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a0), "r"(a1),
               "r"(a2), "r"(a3)
               : "memory");
}

// O[64 x 256] (dims [256 wg, 256 wg + 256)) += P[64 x 64] V[64 x 256], V read in place from the
// KV tile as an MN-major operand: k-steps of 16 keys are 32 B along P's rows and 16 rows
// (2048 B) down V. Waited for.
// kKeys keys per tile; kChunk bytes per 64-dim chunk of the tile (kKeys rows x 128 B).
// kCommitEach: each k-step its own commit group, so that wgmma_wait_pending(n) returns once all
// but the last n k-steps are done (their 16 keys of V read).
template <int kKeys = ConfigWgmma::kBlockN, int kChunk = ConfigWgmma::kChunkBytes, bool kCommitEach = false>
__device__ __forceinline__ void pv_tile_issue(float (&o)[32][4], uint32_t sP, uint32_t sK, int wg) {
  wgmma_fence();
  const uint64_t pa = smem_desc(sP, 16, 1024), vb = smem_desc(sK + wg * 4 * kChunk, kChunk, 1024);
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    wgmma_m64n256k16_vmn(o, pa + 2 * kk, vb + 128 * kk, 1);
    if (kCommitEach) wgmma_commit();
  }
  if (!kCommitEach) wgmma_commit();
}
// wgmma_wait<n> for an n that is a constant once the caller's loop is unrolled (n <= 3).
__device__ __forceinline__ void wgmma_wait_pending(int n) {
  if (n <= 0) wgmma_wait<0>();
  else if (n == 1) wgmma_wait<1>();
  else if (n == 2) wgmma_wait<2>();
  else wgmma_wait<3>();
}
__device__ __forceinline__ void pv_tile_wait(float (&o)[32][4]) {
  wgmma_wait<0>();
  fence_regs(o);
}
__device__ __forceinline__ void pv_tile(float (&o)[32][4], uint32_t sP, uint32_t sK, int wg) {
  pv_tile_issue(o, sP, sK, wg);
  pv_tile_wait(o);
}

// The dynamic shared memory's first 1024-byte boundary (the 128-byte swizzle's atoms are 1024 B;
// the configs' kSmemBytes leave 1024 B of slack for it).
__device__ __forceinline__ uint32_t smem_base_1024(const void* smem_raw) { return (smem_addr(smem_raw) + 1023u) & ~1023u; }

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) verify_attention_wgmma_kernel(Params p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kM = Cfg::kM, kBN = Cfg::kBlockN, kStages = Cfg::kStages, kThreads = Cfg::kThreads;
  static_assert(kM == 64 && kBN == 64 && kThreads == 256, "layout below assumes 64 rows, 64 keys, 2 warpgroups");

  const int item = blockIdx.x;
  __shared__ BlockPlan s_plan;
  wait_for_primary_grid();  // the kernel before this one in the stream: before any global access
  // The combine may launch once every CTA has allowed it; CTA 0 does only after it has published
  // the plan's entries, which the few-row combine reads before its griddepcontrol.wait (as the
  // other main kernels do). Allowing it at entry let the combine read the previous call's entries
  // and merge partials that this call never wrote (kernel/NOTES.md, "The wgmma kernel let the
  // combine read the previous call's plan").
  if (item != 0) allow_dependent_launch();
  plan_block<Cfg>(p, item, &s_plan);
  if (item == 0) {
    if (threadIdx.x == 0) __threadfence();  // plan_block's entries (written before its barrier), then:
    __syncthreads();
    allow_dependent_launch();
  }
  if (item >= s_plan.num_items) return;

  extern __shared__ __align__(16) unsigned char smem_raw[];  // aligned to 1024 B below
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = smem_base_1024(smem_raw);
  const uint32_t sQ = base + Cfg::kQOff, sKV = base + Cfg::kKVOff, sP = base + Cfg::kPOff;
  float* sRed = reinterpret_cast<float*>(smem_raw + (base - raw) + Cfg::kRedOff);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wg = warp / 4;         // warpgroup: keys [32 wg, 32 wg + 32) of S, output dims [256 wg, 256 wg + 256)
  const int row_group = warp % 4;  // rows 16 row_group .. +15 of the tile (wgmma accumulator layout)
  const int H = p.num_heads;
  // The work item lives in shared memory, not registers: O takes 128 registers per thread, and
  // the item's fields are needed only on masked tiles and at the end.
  __shared__ WorkItem s_item;
  if (tid == 0) s_item = decode_item<kM>(p, s_plan, item);
  __syncthreads();
  const WorkItem& w = s_item;

  // ---- loads: 4 threads per row, 18 chunks of 16 bytes each (row = tid / 4)
  const int ld_row = tid / 4, ld_sub = tid % 4;
  {
    const bool ok = ld_row < w.valid_rows;  // rows past the request's last row are zero
    const __nv_bfloat16* src = p.q + (ok ? (w.q_row_base + ld_row) * kQKDim : 0);
    copy_row_swizzled(sQ, ld_row, ld_sub, src, ok);
  }
  cp_async_commit();

  const int num_tiles = ceil_div(w.kv_end - w.kv_begin, kBN);
  // The slot index is fetched a tile ahead (kernel/NOTES.md, v3).
  auto fetch_slot = [&](int tile) -> int {
    const int pos = w.kv_begin + tile * kBN + ld_row;
    return pos < w.kv_end ? __ldg(p.kv_indices + pos) : -1;
  };
  auto load_tile = [&](int slot, int stage) {
    // Rows past the split, and slots outside the pool, are zero-filled. Past the split the row
    // is masked (a zero V row times a zero probability cannot turn into NaN); a slot outside the
    // pool (only an unvalidated call can pass one) reads as a row of zeros that takes its share
    // of the softmax, never a read outside the pool.
    const bool ok = slot >= 0 && slot < p.num_slots;
    const __nv_bfloat16* src = p.kv + (ok ? static_cast<int64_t>(slot) * kQKDim : 0);
    copy_row_swizzled(sKV + stage * Cfg::kTileBytes, ld_row, ld_sub, src, ok);
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_tiles) load_tile(fetch_slot(s), s);
    cp_async_commit();
  }
  int next_slot = fetch_slot(kStages - 1);

  const int r_lo = row_group * 16 + lane / 4;  // this thread's rows: r_lo and r_lo + 8

  float o[32][4];
#pragma unroll
  for (int j = 0; j < 32; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;

  for (int tile = 0; tile < num_tiles; ++tile) {
    cp_async_wait<kStages - 2>();
    fence_proxy_async();
    __syncthreads();  // tile (and Q) landed; the other stage and P are no longer read
    const uint32_t sK = sKV + (tile % kStages) * Cfg::kTileBytes;

    // ---- S = Q K^T for keys [32 wg, 32 wg + 32) over 576 dims. Issued before the next tile's
    // gather, so the tensor cores start at once and the cp.async issue overlaps them.
    float s[4][4];
    qk_tile_issue(s, sQ, sK, wg);
    {
      const int next = tile + kStages - 1;
      if (next < num_tiles) load_tile(next_slot, next % kStages);
      cp_async_commit();
      next_slot = fetch_slot(next + 1);
    }
    qk_tile_wait(s);

    // ---- mask (only tiles that reach the split end or the draft tokens), scale
    if (tile_needs_mask(w, w.kv_begin + tile * kBN, kBN)) {
      const int pos0 = w.kv_begin + tile * kBN + wg * 32 + (lane % 4) * 2;
      const int tok_lo = row_token(w, r_lo, H), tok_hi = row_token(w, r_lo + 8, H);
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (!key_visible(w, pos0 + j * 8 + (e & 1), (e < 2) ? tok_lo : tok_hi)) s[j][e] = -INFINITY;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] *= p.scale_log2;

    // ---- online softmax: the warpgroups agree on each row's running max
    float mx_lo = m_lo, mx_hi = m_hi;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      mx_lo = fmaxf(mx_lo, fmaxf(s[j][0], s[j][1]));
      mx_hi = fmaxf(mx_hi, fmaxf(s[j][2], s[j][3]));
    }
    quad_max(mx_lo, mx_hi);
    if (lane % 4 == 0) {
      sRed[wg * 64 + r_lo] = mx_lo;
      sRed[wg * 64 + r_lo + 8] = mx_hi;
    }
    __syncthreads();
    mx_lo = fmaxf(mx_lo, sRed[(wg ^ 1) * 64 + r_lo]);
    mx_hi = fmaxf(mx_hi, sRed[(wg ^ 1) * 64 + r_lo + 8]);
    float ref_lo, ref_hi, alpha_lo, alpha_hi;
    advance_max(m_lo, m_hi, mx_lo, mx_hi, ref_lo, ref_hi, alpha_lo, alpha_hi);
    float sum_lo = 0.f, sum_hi = 0.f;
    // This thread's probabilities: keys 32 wg + 8 j + 2 (lane % 4) (+1) of rows r_lo, r_lo + 8.
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float p0 = fast_exp2(s[j][0] - ref_lo), p1 = fast_exp2(s[j][1] - ref_lo);
      const float p2 = fast_exp2(s[j][2] - ref_hi), p3 = fast_exp2(s[j][3] - ref_hi);
      sum_lo += p0 + p1;
      sum_hi += p2 + p3;
      store_p_pair(sP, r_lo, wg * 32 + j * 8 + (lane % 4) * 2, pack_bf16(p0, p1));
      store_p_pair(sP, r_lo + 8, wg * 32 + j * 8 + (lane % 4) * 2, pack_bf16(p2, p3));
    }
    // Each warpgroup keeps the sum over its own keys; the two are added once, after the last tile.
    l_lo = l_lo * alpha_lo + sum_lo;
    l_hi = l_hi * alpha_hi + sum_hi;
    rescale_o_lazy(o, alpha_lo, alpha_hi);
    fence_proxy_async();
    __syncthreads();  // P complete

    // ---- O[:, 256 wg ..] += P V[:, 256 wg ..] over the 64 keys
    pv_tile(o, sP, sK, wg);
  }
  cp_async_wait<0>();

  // ---- finish: row sums across the quad and the two warpgroups, normalise, write
  quad_sum(l_lo, l_hi);
  __syncthreads();  // the last tile's maxima are read; sRed is free
  if (lane % 4 == 0) {
    sRed[wg * 64 + r_lo] = l_lo;
    sRed[wg * 64 + r_lo + 8] = l_hi;
  }
  __syncthreads();
  // Added in warpgroup order (0 + 1) by both, so both get bitwise the same sum.
  l_lo = sRed[r_lo] + sRed[64 + r_lo];
  l_hi = sRed[r_lo + 8] + sRed[64 + r_lo + 8];
  store_rows<kM>(p, w, o, m_lo, m_hi, l_lo, l_hi, r_lo, wg * 256 + (lane % 4) * 2, wg == 0);
#else
  __trap();  // built for sm_90a only; the launcher never selects it elsewhere
#endif
}

// ---------------------------------------------------------------------------------------------
// Warp-specialized variant (config "wgmma-ws", kernel/NOTES.md v8-v9, v15, v47-v52): three
// warpgroups, 384 threads, KV tiles of 48 keys in 3 stages (32 keys in 5 with -DVA_WS_BLOCK_N=32).
//   WG0  ("S")   holds Q's 512 latent dims in registers (the wgmma A operand: 32 k-steps x 4
//                registers) and its 64 RoPE dims in shared memory, computes S = Q K^T for the 48
//                keys of a tile (36 x wgmma m64n48k16, K from shared memory), the online softmax,
//                and writes bf16 P and each row's rescale factor to shared memory. It keeps the
//                running max (registers) and its partial row sums (shared memory).
//   WG1, WG2     each own 256 of the 512 output dims (O: 128 registers per thread), multiply P by
//                their half of V (3 x wgmma m64n256k16), and gather the KV chunks that they alone
//                read for PV: WG1 dims 0-255 (chunks 0-3) and the RoPE chunk 8 (read only by QK,
//                which is done before P exists), WG2 dims 256-511 (chunks 4-7).
// With Q (but its RoPE part) out of shared memory the KV tiles get 162 KB: WG0 computes S for
// tile i + 1 while WG1/WG2 multiply tile i, and a stage is refilled 3 tiles ahead. 48 keys rather
// than 32 spread the per-tile costs that do not grow with the keys (the hand-off, barriers, the
// row-max shuffles) over 1.5x the keys, and run wgmma at n48, which wastes less of each
// instruction than n32 (kernel/NOTES.md v15).
// Hand-offs: named barriers (bar.arrive by the producing side, bar.sync by the waiting side), and
// one mbarrier for the data that threads of WG0 write and threads of WG1/WG2 read:
//   kBarFull + s  tile in stage s landed (WG1/WG2 -> WG0)
//   bar_p_ready   P and the rescale factors of the current tile written (WG0 -> WG1/WG2); with
//                 the last tile, also the final row max and sum. The 32 WG0 threads that write
//                 rescale factors arrive, each after its warp's __syncwarp (kernel/NOTES.md, v12:
//                 racecheck clean, where a named barrier here was not)
//   kBarPVDone    both halves of PV done with P (WG1/WG2 -> WG0, before it overwrites P)
//   kBarS         WG0's own 128 threads: Q's rows in shared memory landed (once; before that
//                 also when a single request's guessed rows of Q are staged again, v62)
//   kBarEpilogue  WG1 + WG2: the split partial's staging (store_partial_half)
// Config "wgmma-ws-pipe" (kPipeQK, v52's loop): WG0 holds only Q's latent dims 0-319 in
// registers (dims 320-575 in shared memory), which frees the registers of a second S accumulator
// set, and issues QK of tile i + 1 into it in parts between the steps of tile i's softmax. P and the rescale factors then get two buffers (by tile parity), and every hand-off
// between the roles is an mbarrier: bar_full[s] (each of the 256 gathering threads arrives through
// cp.async.mbarrier.arrive once its copies of the tile complete), bar_p_ready[b] and
// bar_pv_done[b] (per P buffer), so that no side can run a phase ahead of a barrier.
// Registers: setmaxnreg moves WG0 to 184 and WG1/WG2 to 160 each (128 x (184 + 2 x 160) = 64512,
// the 168 x 384 the CTA starts with). ptxas accepts no less than 160 for a PV warpgroup, and
// spills in WG0 with all of Q in registers beside a second S set or with 64-key tiles (S twice as
// large). 48 keys fit: P goes out with stmatrix as soon as it is packed (no per-word addresses),
// each role takes its accumulator rows from %tid.x, and the gather addresses its chunks at
// constant offsets.
// ---------------------------------------------------------------------------------------------
template <int kBlockN_, int kStages_, bool kPipeQK_>
struct ConfigWgmmaWsT {
  static constexpr int kM = 64;
  static constexpr int kBlockN = kBlockN_;                    // keys per KV tile: 32 or 48
  static constexpr int kStages = kStages_;
  static constexpr int kMinSplitKeys = 128;  // a split holds at least this many keys (kernel/NOTES.md, v21)
  static constexpr int kThreads = 384;
  // Q's last kQSmemLatent latent 64-dim chunks sit in shared memory beside its RoPE chunk (SS
  // k-steps), the others in registers (RS k-steps).
  static constexpr bool kPipeQK = kPipeQK_;                   // v52's loop (above), else v41's
  static constexpr int kQSmemLatent = kPipeQK ? 3 : 0;
  static constexpr int kQRegSteps = 32 - 4 * kQSmemLatent;   // k-steps of Q held in registers
  static constexpr int kChunkBytes = kBlockN * 128;           // kBlockN rows x 64 dims (128 B): whole swizzle atoms
  static constexpr int kChunks = kQKDim / 64;
  static constexpr int kTileBytes = kChunks * kChunkBytes;    // 36 KB (32 keys) or 54 KB (48) per stage
  static constexpr int kKVOff = 0;
  static constexpr int kQSmemOff = kStages * kTileBytes;      // Q's chunks 8 - kQSmemLatent .. 8: 64 rows x 128 B each, swizzled
  static constexpr int kPOff = kQSmemOff + (kQSmemLatent + 1) * 64 * 128;  // P: 64 rows x 64 keys (kBlockN used), swizzled
  static constexpr int kPBufs = kPipeQK ? 2 : 1;              // P buffers (and rescale factors), used in turn
  static constexpr int kAlphaOff = kPOff + kPBufs * 64 * 128; // [kPBufs][64] rescale factor per row
  static constexpr int kStatOff = kAlphaOff + kPBufs * 64 * 4; // [2][64] final row max, row sum
  static constexpr int kSumOff = kStatOff + 2 * 64 * 4;       // [128 threads][2] running partial row sums
  static constexpr int kQBarOff = kSumOff + 128 * 2 * 4;      // mbarrier of Q's bulk tensor copies (v67)
  static constexpr int kQReadBarOff = kQBarOff + 8;           // kPipeQK: WG0 has read Q's staged chunks (v68)
  static constexpr int kSmemUsed = kQReadBarOff + 8;
  static constexpr int kSmemBytes = kSmemUsed + 1024;         // slack to align the base to 1024 B
  static constexpr int kRegsS = 184, kRegsPV = 160;
  static_assert(kBlockN == 32 || kBlockN == 48, "S tiles of 32 or 48 keys (wgmma n32 / n48, PV k-steps of 16)");
  static_assert(kChunkBytes % 1024 == 0, "chunks of whole 8-row swizzle atoms");
  static_assert(128 * (kRegsS + 2 * kRegsPV) <= 168 * kThreads, "register budget of one CTA per SM");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one CTA per SM on sm_90");
};
// The KV tile: 48 keys x 3 stages (4 do not fit in 227 KB), or 32 keys x 5 stages (v8-v14). A
// build flag so that tuning runs can time both from one tree.
#ifndef VA_WS_BLOCK_N
#define VA_WS_BLOCK_N 48
#endif
#if VA_WS_BLOCK_N == 32
#define VA_WS_STAGES 5
#else
#define VA_WS_STAGES 3
#endif
// Two loops, one config each; `auto` picks per call by the rows a request's keys are multiplied
// by (wgmma_ws_pipelined below):
//   wgmma-ws       v41's loop: QK of a tile, then its softmax, Q's latent dims all in registers;
//   wgmma-ws-pipe  v52's loop: QK of tile i + 1 issued in parts between the steps of tile i's
//                  softmax, Q's chunks 5-7 in shared memory, P double-buffered, the tiles
//                  announced by their own gathers (kernel/NOTES.md, v47-v54).
using ConfigWgmmaWs = ConfigWgmmaWsT<VA_WS_BLOCK_N, VA_WS_STAGES, false>;
// (With 32-key tiles its Q and second P buffer leave room for 4 stages, not 5.)
using ConfigWgmmaWsPipe = ConfigWgmmaWsT<VA_WS_BLOCK_N, VA_WS_BLOCK_N == 32 ? 4 : VA_WS_STAGES, true>;
// Either wgmma-ws config (both store fp16 split partials: half_partials).
template <class Cfg>
constexpr bool kIsWgmmaWs = false;
template <int kBlockN, int kStages, bool kPipeQK>
constexpr bool kIsWgmmaWs<ConfigWgmmaWsT<kBlockN, kStages, kPipeQK>> = true;
// Where the pipelined loop pays: with one or two row tiles per request (<= 128 rows), a call
// streams its keys from DRAM and the tile's chain from arrival to refill sets the pace; there the
// pipelined loop's QK (12 of its 36 k-steps from shared memory) lengthens the chain and v41's loop
// is 6-8 % faster at one row tile, within +-3 % at two. From four row tiles up the tile loop binds
// and the pipelined loop is 1-3.5 % faster (kernel/NOTES.md, v53-v54). A build flag, so that an
// A/B can time the other loop at the rows in between (v73).
#ifndef VA_PIPE_MIN_ROWS
#define VA_PIPE_MIN_ROWS 256
#endif
constexpr int kPipeMinRowsPerRequest = VA_PIPE_MIN_ROWS;
inline bool wgmma_ws_pipelined(long long rows, int batch) {
  return batch > 0 && rows >= static_cast<long long>(kPipeMinRowsPerRequest) * batch;
}

// Is score (j, e) of a thread's S accumulators (n8 tile j; e & 2: the row 8 below, e & 1: the
// second key) visible, by its two rows' 64-key windows of visibility bits (visible_window)?
__device__ __forceinline__ bool key_visible_bit(uint64_t vis_lo, uint64_t vis_hi, int j, int e) {
  return ((e & 2) ? vis_hi : vis_lo) >> (8 * j + (e & 1)) & 1ull;
}

__device__ __forceinline__ void named_bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
// mbarriers: arrive releases and the wait acquires, per thread. compute-sanitizer racecheck
// follows them; it did not follow data handed from WG0 to WG1/WG2 through named barriers
// (bar.arrive / bar.sync in different branches), and reported hazards there (kernel/NOTES.md).
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrive on the mbarrier once every cp.async this thread issued before has completed (.noinc: the
// arrive is one of the count the barrier was initialised with).
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// The arrive that also announces `bytes` of bulk copies still to come (their complete_tx ends the
// phase), and one bulk tensor copy of a 2-D box at (c0, c1) (innermost coordinate first) of the
// tensor map at `map` (a __grid_constant__ parameter) into shared memory at dst.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(map), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// S[64 x kBN] = Q K^T over 576 dims, K from the kBN-key tile at sK, in 36 k-steps: the dims whose
// Q sits in shared memory (sQs: its chunks 8 - kSmemLatent .. 8, the RoPE chunk last) first, then
// the latent dims with Q from registers (qa[k-step], chunks 0 .. 7 - kSmemLatent). The
// shared-memory k-steps first: 1-2 % faster in the loop-bound cases than last (kernel/NOTES.md,
// v13). qk_tile_rs_issue_steps issues k-steps [first, first + count), the fence with the first
// and the commit with the last (`first` and `count` constants once the caller is unrolled; between
// two ranges the caller may not touch s or qa); qk_tile_rs_issue all 36.
template <int kNT, int kChunk, int kRegSteps>
__device__ __forceinline__ void qk_tile_rs_issue_steps(float (&s)[kNT][4], const uint32_t (&qa)[kRegSteps][4],
                                                       uint32_t sQs, uint32_t sK, int first, int count) {
  constexpr int kSmemLatent = (32 - kRegSteps) / 4, kSmemSteps = 4 * (kSmemLatent + 1);
  if (first == 0) wgmma_fence();
  const uint64_t kb = smem_desc(sK, 16, 1024), qs = smem_desc(sQs, 16, 1024);
#pragma unroll
  for (int g = 0; g < kSmemSteps + kRegSteps; ++g) {
    if (g < first || g >= first + count) continue;
    if (g < kSmemSteps) {
      const int i = g / 4, k = g % 4;
      wgmma_qk_ss<kNT>(s, qs + i * ((64 * 128) >> 4) + 2 * k, kb + (8 - kSmemLatent + i) * (kChunk >> 4) + 2 * k,
                       g > 0);
    } else {
      const int ks = g - kSmemSteps;
      wgmma_qk_rs<kNT>(s, qa[ks], kb + (ks / 4) * (kChunk >> 4) + 2 * (ks % 4), 1);
    }
  }
  if (first + count == kSmemSteps + kRegSteps) wgmma_commit();
}
template <int kNT, int kChunk, int kRegSteps>
__device__ __forceinline__ void qk_tile_rs_issue(float (&s)[kNT][4], const uint32_t (&qa)[kRegSteps][4],
                                                 uint32_t sQs, uint32_t sK) {
  qk_tile_rs_issue_steps<kNT, kChunk>(s, qa, sQs, sK, 0, 36);
}

// Q rows r_lo, r_lo + 8 of the tile, dims 0-511, as the A fragments of 32 k-steps. Padding rows
// (past valid_rows) load the tile's first row instead: finite values whose results are dropped.
// (A select per register instead costs ptxas ~20 registers here, and WG0 has none to spare.)
template <int kSteps>
__device__ __forceinline__ void load_q_fragments(uint32_t (&qa)[kSteps][4], const __nv_bfloat16* q, const WorkItem& w,
                                                 int r_lo, int lane) {
  const int row_lo = r_lo < w.valid_rows ? r_lo : 0, row_hi = r_lo + 8 < w.valid_rows ? r_lo + 8 : 0;
#ifndef VA_Q_NARROW_LOADS
  // 8-byte loads, half the requests of one 4-byte load a word (build flag VA_Q_NARROW_LOADS, for
  // an A/B): in each k-step's 8 words, lanes c = 0, 2 of a quad load words c, c + 1 and lanes
  // c = 1, 3 words c + 3, c + 4; one shuffle with the neighbour lane then leaves lane c with words
  // c and c + 4, its fragment. 16-byte loads and a 4 x 4 quad transpose spilled (kernel/NOTES.md, v17).
  const int c = lane % 4;
  const bool odd = c & 1;
  const int off = odd ? 3 + c : c;  // even: a whole 8-byte pair either way
  const uint2* p_lo = reinterpret_cast<const uint2*>(q + (w.q_row_base + row_lo) * kQKDim + 2 * off);
  const uint2* p_hi = reinterpret_cast<const uint2*>(q + (w.q_row_base + row_hi) * kQKDim + 2 * off);
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks) {
    const uint2 a = __ldg(p_lo + 4 * ks), b = __ldg(p_hi + 4 * ks);
    const uint32_t ra = __shfl_xor_sync(0xffffffffu, odd ? a.x : a.y, 1);
    const uint32_t rb = __shfl_xor_sync(0xffffffffu, odd ? b.x : b.y, 1);
    qa[ks][0] = odd ? ra : a.x;
    qa[ks][2] = odd ? a.y : ra;
    qa[ks][1] = odd ? rb : b.x;
    qa[ks][3] = odd ? b.y : rb;
  }
#else
  const uint32_t* q_lo = reinterpret_cast<const uint32_t*>(q + (w.q_row_base + row_lo) * kQKDim) + lane % 4;
  const uint32_t* q_hi = reinterpret_cast<const uint32_t*>(q + (w.q_row_base + row_hi) * kQKDim) + lane % 4;
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks) {  // 32-bit word 8 ks + lane % 4: dims 16 ks + 2 (lane % 4), +1
    qa[ks][0] = __ldg(q_lo + ks * 8);
    qa[ks][1] = __ldg(q_hi + ks * 8);
    qa[ks][2] = __ldg(q_lo + ks * 8 + 4);
    qa[ks][3] = __ldg(q_hi + ks * 8 + 4);
  }
#endif
}

// This thread's accumulator rows in its warpgroup's 64 x N wgmma tiles: r and r + 8. Read from
// %tid.x in each role rather than computed once before the roles split: ptxas would otherwise keep
// the one value live into both roles and spill it where the 48-key tile leaves no register free.
__device__ __forceinline__ int accumulator_row() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
  return ((t / 32) % 4) * 16 + (t % 32) / 4;
}

// One PV warpgroup's share of a KV row, eight threads a row: unit u (16 bytes) of this half's 64-dim
// chunks 4 half .. 4 half + 3, and of chunk 8 (the RoPE dims) in half 0. A warp instruction copies
// 4 rows x 128 contiguous bytes, whole L2 lines: the load path takes these in half the issue time
// of 8 rows x 64 bytes (four threads a row, v8-v18) and ~10 % faster (kernel/NOTES.md, v19).
// `src` must be a readable address even when !valid (nothing is read then).
template <int kChunk>
__device__ __forceinline__ void copy_row_line(uint32_t dst_tile, int r, int u, int half, const __nv_bfloat16* src,
                                              bool valid, uint64_t policy) {
  const uint32_t d = dst_tile + r * 128 + 4 * half * kChunk + ((u ^ (r & 7)) << 4);
  const __nv_bfloat16* s0 = src + 4 * half * 64 + u * 8;
#pragma unroll
  for (int c = 0; c < 4; ++c) cp_async_16_evict_first(d + c * kChunk, s0 + c * 64, valid, policy);
  if (half == 0) cp_async_16_evict_first(d + 8 * kChunk, s0 + 8 * 64, valid, policy);
}

// A split's partial (64 rows x 512, normalised, and its lse) from the PV warpgroups once every PV
// and QK of the split is done, as fp16 (half_partials): each 256-dim half row (one warpgroup's)
// divided by its own power of two above its largest |value|, so the values sit in (-1, 1) with
// 11 significant bits, and the scale goes beside the lse. The rows go to the free KV stages
// (padded to 1040 B: conflict-free 4-byte stores), then all 256 threads copy the valid rows out,
// 16 bytes each an instruction (512 contiguous bytes a warp): ~0.6 us less than one 1 KB bulk copy
// a row, which the bulk-copy unit issued at ~45 ns each (kernel/NOTES.md, v17).
// Against fp32 partials: half the bytes written here and read by the combine, 2-3 us less on the
// short-prefix cases, the same error against the fp64 oracle to 3 digits (kernel/NOTES.md, v12).
__device__ __forceinline__ void store_partial_half(const Params& p, const WorkItem& w, const float (&o)[32][4],
                                                   float m_lo, float m_hi, float l_lo, float l_hi, int r_lo,
                                                   int half, int ptid, unsigned char* smem_base, int bar) {
  constexpr int kRowHalves = kVDim + 8;
  const float inv_lo = row_inv(l_lo), inv_hi = row_inv(l_hi);
  const int lane = threadIdx.x % 32;
  float a_lo = 0.f, a_hi = 0.f;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    a_lo = fmaxf(a_lo, fmaxf(fabsf(o[j][0]), fabsf(o[j][1])));
    a_hi = fmaxf(a_hi, fmaxf(fabsf(o[j][2]), fabsf(o[j][3])));
  }
  quad_max(a_lo, a_hi);
  const float sc_lo = half_scale(a_lo * inv_lo), sc_hi = half_scale(a_hi * inv_hi);
  const float mul_lo = inv_lo / sc_lo, mul_hi = inv_hi / sc_hi;  // exact: sc is a power of two
  named_bar_sync(bar, 256);  // both halves' PV done reading the stages (QK was done before P)
  __half* lo = reinterpret_cast<__half*>(smem_base) + r_lo * kRowHalves + half * 256 + (lane % 4) * 2;
  __half* hi = lo + 8 * kRowHalves;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    *reinterpret_cast<__half2*>(lo + j * 8) = __floats2half2_rn(o[j][0] * mul_lo, o[j][1] * mul_lo);
    *reinterpret_cast<__half2*>(hi + j * 8) = __floats2half2_rn(o[j][2] * mul_hi, o[j][3] * mul_hi);
  }
  named_bar_sync(bar, 256);
  const int64_t slot = w.partial_base + w.local;
  {
    constexpr int kUnits = kVDim * 2 / 16;  // 16-byte units a row
    const int units = w.valid_rows * kUnits;
    const char* src = reinterpret_cast<const char*>(smem_base);
    char* dst = reinterpret_cast<char*>(half_partials(p) + slot * 64 * kVDim);
#pragma unroll 4
    for (int u = ptid + 128 * half; u < units; u += 256) {
      const int row = u / kUnits, c = u % kUnits;
      const uint4 v = *reinterpret_cast<const uint4*>(src + row * kRowHalves * 2 + c * 16);
      *reinterpret_cast<uint4*>(dst + row * kVDim * 2 + c * 16) = v;
    }
  }
  if (lane % 4 == 0) {
    float* scales = half_partial_scales(p);
    if (r_lo < w.valid_rows) scales[(slot * 64 + r_lo) * 2 + half] = sc_lo;
    if (r_lo + 8 < w.valid_rows) scales[(slot * 64 + r_lo + 8) * 2 + half] = sc_hi;
    if (half == 0) {
      if (r_lo < w.valid_rows) p.partial_lse[slot * 64 + r_lo] = row_lse(m_lo, l_lo);
      if (r_lo + 8 < w.valid_rows) p.partial_lse[slot * 64 + r_lo + 8] = row_lse(m_hi, l_hi);
    }
  }
}

// Before the plan: this CTA's slice of q and of kv_indices into L2 (one prefetch per 128-byte
// line), and the tree-mask offsets that the plan reads with the batch's other bounds.
__device__ __forceinline__ void l2_prefetch_slice(const char* base, int lines) {
  const int per = (lines + gridDim.x - 1) / gridDim.x, end = min(lines, per * (blockIdx.x + 1));
  for (int l = per * blockIdx.x + threadIdx.x; l < end; l += blockDim.x)
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(base + static_cast<int64_t>(l) * 128));
}
// kv_indices' lines prefetched at entry with no load first: up to this many a CTA (8,448 lines,
// ~270k slots on 132 SMs). A longer kv_indices (an over-allocated buffer, as the SGLang adapter
// passes in CUDA-graph mode) has the rest prefetched only up to kv_indptr[B], by WG1-WG2's
// threads, which wait for the plan anyway (WG0's thread 32 issues Q's copies and warp 0 plans
// right after this). v38-v76 prefetched every line: +5-7 us a call at SGLang's graph-buffer size
// (kernel/NOTES.md, v77).
constexpr int kEntryIndexLinesPerCta = 64;
__device__ __forceinline__ void entry_prefetch(const Params& p) {
  l2_prefetch_slice(reinterpret_cast<const char*>(p.q), p.num_q_rows * 9);  // 1152 B a row
  const char* kv_indices = reinterpret_cast<const char*>(p.kv_indices);
  const int index_lines = (p.num_kv_indices + 31) / 32;
  const int near = min(index_lines, kEntryIndexLinesPerCta * static_cast<int>(gridDim.x));
  l2_prefetch_slice(kv_indices, near);
  if (index_lines > near && threadIdx.x >= 128) {
    const int used = min(index_lines, (__ldg(p.kv_indptr + p.batch) + 31) / 32);
    const int far = max(used - near, 0), per = (far + gridDim.x - 1) / gridDim.x;
    const int end = near + min(far, per * static_cast<int>(blockIdx.x + 1));
    for (int l = near + per * blockIdx.x + threadIdx.x - 128; l < end; l += blockDim.x - 128)
      asm volatile("prefetch.global.L2 [%0];\n" ::"l"(kv_indices + static_cast<int64_t>(l) * 128));
  }
  if (threadIdx.x == 0) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p.tree_mask_indptr));
}

// Q of a row tile into shared memory by kIssuers of WG0's threads (t = 0 .. kIssuers - 1), issued
// and committed, not waited for (kernel/NOTES.md, v60-v62):
// - the dims WG0 holds in registers (the first kQRegSteps k-steps) into staging rows in KV stages
//   1.., 16-byte units a row in order, so that a warp instruction reads 512 contiguous bytes of
//   one row; a row's pitch is an odd number of 16-byte units, so that ldmatrix's 8 rows fall in 8
//   different bank groups; the stages are free until WG1/WG2 gather tiles 1.. there, which they
//   do only once WG0 has read its fragments (bar_q_read);
// - the dims read by SS k-steps (chunks 8 - kQSmemLatent .. 8, the RoPE dims last) into their
//   swizzled place at sQs, two threads a row.
// Padding rows (>= valid_rows) are zero-filled: their results are dropped.
template <class Cfg>
struct QStaging {
  static constexpr int kUnits = Cfg::kQRegSteps * 2;          // 16-byte units of a row's register dims
  static constexpr int kPitch = Cfg::kQRegSteps * 32 + 16;    // bytes a staging row
  static constexpr int kOff = Cfg::kKVOff + Cfg::kTileBytes;  // KV stage 1 (tile 0's stage is gathered meanwhile)
  static_assert(Cfg::kM * kPitch <= (Cfg::kStages - 1) * Cfg::kTileBytes, "staging rows fit in KV stages 1..");
};
// Q's chunks 8 - kQSmemLatent .. 8 (the RoPE dims last) of row-tile slot x / 2 into their swizzled
// place at sQs (the SS k-steps' operand): half x % 2 of each chunk's 8 units; not committed.
template <class Cfg>
__device__ __forceinline__ void copy_q_smem_dims(const Params& p, uint32_t sQs, int64_t q_row_base, int valid_rows,
                                                 int x) {
  constexpr int kQSmemLatent = Cfg::kQSmemLatent;
  const int r = x / 2, sub = x % 2;
  const bool ok = r < valid_rows;
  const __nv_bfloat16* src = p.q + (ok ? (q_row_base + r) * kQKDim + (8 - kQSmemLatent) * 64 : 0);
#pragma unroll
  for (int i = 0; i <= kQSmemLatent; ++i)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int u = sub + 2 * k;
      cp_async_16_shared(sQs + i * 64 * 128 + r * 128 + ((u ^ (r & 7)) << 4), src + i * 64 + u * 8, ok);
    }
}
template <class Cfg, int kIssuers = 128>
__device__ __forceinline__ void stage_q(const Params& p, uint32_t base, int64_t q_row_base, int valid_rows, int t) {
  using S = QStaging<Cfg>;
  const uint32_t stage = base + S::kOff;
  for (int i = t; i < Cfg::kM * S::kUnits; i += kIssuers) {
    const int r = i / S::kUnits, u = i % S::kUnits;
    const bool ok = r < valid_rows;
    cp_async_16_shared(stage + r * S::kPitch + u * 16, p.q + (ok ? (q_row_base + r) * kQKDim + u * 8 : 0), ok);
  }
  for (int x = t; x < 2 * Cfg::kM; x += kIssuers) copy_q_smem_dims<Cfg>(p, base + Cfg::kQSmemOff, q_row_base, valid_rows, x);
  cp_async_commit();
}
// WG0's A fragments of Q's register dims from the staging rows: one ldmatrix.x4 a k-step and warp
// (matrices: rows 0-7 / 8-15 of the warp's 16, dims 0-7 / 8-15 of the k-step), the words
// load_q_fragments gives.
template <class Cfg>
__device__ __forceinline__ void ldmatrix_q_fragments(uint32_t (&qa)[Cfg::kQRegSteps][4], uint32_t base, int warp_in_wg,
                                                     int lane) {
  using S = QStaging<Cfg>;
  const int m = lane / 8, r = 16 * warp_in_wg + (m & 1) * 8 + lane % 8;
  const uint32_t addr = base + S::kOff + r * S::kPitch + (m >> 1) * 16;
#pragma unroll
  for (int ks = 0; ks < Cfg::kQRegSteps; ++ks)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(qa[ks][0]), "=r"(qa[ks][1]), "=r"(qa[ks][2]), "=r"(qa[ks][3])
                 : "r"(addr + ks * 32)
                 : "memory");
}
// Does a single request's Q go into shared memory at the kernel's entry (else WG0 loads its
// fragments directly after decode)? v41's loop since v62, v52's since v68, which since v69 also
// stages a batch's Q, after decode (VA_PIPE_Q_LOADS builds v67's, which does neither).
template <class Cfg>
constexpr bool kQStagedAtEntry =
#if defined(VA_Q_CP_ASYNC) || defined(VA_PIPE_Q_LOADS)
    !Cfg::kPipeQK;
#else
    true;
#endif
#ifndef VA_Q_CP_ASYNC
// Where stage_q_tma puts the chunks that WG0 holds in registers: KV stages 1.. for v41's loop (8
// chunks, 64 KB), KV stage 2 alone for v52's (5 chunks, 40 KB). Either way the loop's tiles 1..
// are gathered once WG0 has read them (bar_q_read).
template <class Cfg>
constexpr int kQTmaStageOff = Cfg::kPipeQK ? Cfg::kKVOff + (Cfg::kStages - 1) * Cfg::kTileBytes : QStaging<Cfg>::kOff;
// v67: a row tile of Q by bulk tensor copies, issued by one thread (p.q_map: 64 x 64 boxes, the
// 128-byte swizzle): the chunks WG0 holds in registers to kQTmaStageOff in the swizzled chunk
// layout (WG0 reads its fragments there), the others (the RoPE chunk last) to their place at sQs.
// One arrive on `bar` announces the 72 KB; the phase completes when every box has landed (rows past q's end as zeros,
// padding rows as whatever q holds there: finite or not, their results are dropped). The copies go
// through the SM's bulk-copy unit, not the load path that the plan's loads, the slots and tile 0's
// gather take (kernel/NOTES.md, v67).
template <class Cfg>
__device__ __forceinline__ void stage_q_tma(const Params& p, uint32_t base, int64_t q_row_base, uint32_t bar) {
  constexpr int kChunk = 64 * 128, kRegChunks = Cfg::kQRegSteps / 4, kStage = kQTmaStageOff<Cfg>;
  static_assert(kRegChunks * 4 == Cfg::kQRegSteps && kRegChunks + Cfg::kQSmemLatent + 1 == 9, "9 chunks of Q");
  static_assert(kStage % 1024 == 0 && Cfg::kQSmemOff % 1024 == 0, "swizzle atoms are 1024 B");
  static_assert(kStage + kRegChunks * kChunk <= Cfg::kKVOff + Cfg::kStages * Cfg::kTileBytes, "in the KV stages");
  const int row = static_cast<int>(q_row_base);  // < N * H, an int
  mbar_arrive_expect_tx(bar, 9 * kChunk);
#pragma unroll
  for (int c = 0; c < kRegChunks; ++c) tma_load_2d(base + kStage + c * kChunk, p.q_map, c * 64, row, bar);
#pragma unroll
  for (int i = 0; i <= Cfg::kQSmemLatent; ++i)
    tma_load_2d(base + Cfg::kQSmemOff + i * kChunk, p.q_map, (kRegChunks + i) * 64, row, bar);
}
// WG0's A fragments from stage_q_tma's chunks: as ldmatrix_q_fragments, each 16-byte unit u of row
// r at u ^ (r % 8) (r % 8 = lane % 8 here: four addresses a lane, conflict-free).
template <class Cfg>
__device__ __forceinline__ void ldmatrix_q_fragments_swizzled(uint32_t (&qa)[Cfg::kQRegSteps][4], uint32_t base,
                                                              int warp_in_wg, int lane) {
  const int m = lane / 8, r = 16 * warp_in_wg + (m & 1) * 8 + lane % 8;
  const uint32_t row = base + kQTmaStageOff<Cfg> + r * 128;
#pragma unroll
  for (int ks = 0; ks < Cfg::kQRegSteps; ++ks)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(qa[ks][0]), "=r"(qa[ks][1]), "=r"(qa[ks][2]), "=r"(qa[ks][3])
                 : "r"(row + (ks / 4) * (64 * 128) + (((2 * (ks % 4) + (m >> 1)) ^ (lane % 8)) << 4))
                 : "memory");
}
// v69: the same layout by cp.async, WG0's 128 threads, where the host has no tensor map for q
// (`wgmma-ws-pipe`, whose WG0 then still reads its fragments from one place); not committed.
template <class Cfg>
__device__ __forceinline__ void stage_q_cp_async_swizzled(const Params& p, uint32_t base, int64_t q_row_base,
                                                          int valid_rows, int t) {
  constexpr int kChunk = 64 * 128, kRegChunks = Cfg::kQRegSteps / 4, kUnits = kQKDim / 8;
  for (int i = t; i < Cfg::kM * kUnits; i += 128) {
    const int r = i / kUnits, u = i % kUnits, c = u / 8;
    const uint32_t chunk = c < kRegChunks ? base + kQTmaStageOff<Cfg> + c * kChunk
                                          : base + Cfg::kQSmemOff + (c - kRegChunks) * kChunk;
    const bool ok = r < valid_rows;
    cp_async_16_shared(chunk + r * 128 + (((u % 8) ^ (r & 7)) << 4), p.q + (ok ? (q_row_base + r) * kQKDim + u * 8 : 0),
                       ok);
  }
}
#endif
// A single request's row tile of Q as the plan will give it (its row tiles from q's row count, the
// tile from the block index), so that Q's copies can go out before the plan; WG0 checks it against
// the decoded work item. False for batches (and for a q without rows): no guess.
__device__ __forceinline__ bool guess_q_rows(const Params& p, int item, int kM, int64_t& row_base, int& valid_rows) {
  if (p.batch != 1 || p.num_q_rows <= 0) return false;
  const int row_tiles = ceil_div(p.num_q_rows, kM), tile = item % row_tiles;
  row_base = static_cast<int64_t>(tile) * kM;
  valid_rows = min(kM, p.num_q_rows - tile * kM);
#ifdef VA_Q_CP_ASYNC
  return true;
#else
  return p.q_tma != 0;  // staged by stage_q_tma, which needs the map
#endif
}

// p is a __grid_constant__ parameter: its tensor map (q_map) is read by address (stage_q_tma).
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) verify_attention_wgmma_ws_kernel(const __grid_constant__ Params p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kM = Cfg::kM, kBN = Cfg::kBlockN, kStages = Cfg::kStages, kThreads = Cfg::kThreads;
  static_assert(kM == 64 && (kBN == 32 || kBN == 48) && kThreads == 384, "layout below assumes these");
  constexpr int kNT = kBN / 8;  // n8 tiles of S: a thread holds 2 x kNT scores of each of its two rows
  constexpr int kBarFull = 1, kBarPVDone = kBarFull + kStages, kBarS = kBarPVDone + 1;
  constexpr int kBarEpilogue = kBarS + 1;
  static_assert(kBarEpilogue < 16, "16 named barriers per CTA");

  const int item = blockIdx.x;
  __shared__ BlockPlan s_plan;
  wait_for_primary_grid();  // the kernel before this one in the stream: before any global access
  // The combine may launch once every CTA has allowed it; CTA 0 does only after it has published
  // the plan's entries, which the few-row combine reads before its griddepcontrol.wait.
  if (item != 0) allow_dependent_launch();
  entry_prefetch(p);
#ifndef VA_Q_FRAGMENT_LOADS
  // One request: Q's copies go out at entry, from the rows the plan will give (guess_q_rows), while
  // warp 0 plans; WG0 checks the guess after decode (kernel/NOTES.md, v60-v62, v67-v69).
  // VA_Q_CP_ASYNC builds v62's copies by WG0's warps 1-3, on v41's loop only.
#ifdef VA_Q_CP_ASYNC
  if (!Cfg::kPipeQK && threadIdx.x >= 32 && threadIdx.x < 128) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    int64_t row_base;
    int valid_rows;
    if (guess_q_rows(p, item, Cfg::kM, row_base, valid_rows))
      stage_q<Cfg, 96>(p, smem_base_1024(smem_raw), row_base, valid_rows, threadIdx.x - 32);
  }
#else
  // v67: by bulk tensor copies, which thread 32 issues (on an mbarrier of its own, initialised here).
  // (In dynamic shared memory: a static __shared__ one moves the others, and ptxas then schedules
  // WG0's tile loop anew; kernel/NOTES.md, v65-v67.)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t bar_q = smem_base_1024(smem_raw) + Cfg::kQBarOff;
  if constexpr (kQStagedAtEntry<Cfg>) {
    if (threadIdx.x == 32) {
      int64_t row_base;
      int valid_rows;
      const bool guessed = guess_q_rows(p, item, Cfg::kM, row_base, valid_rows);
      // wgmma-ws-pipe also copies a batch's Q on this barrier, after decode (v69).
      if (guessed || Cfg::kPipeQK) {
        mbar_init(bar_q, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // the init, before copies complete on it
      }
      if (guessed) stage_q_tma<Cfg>(p, smem_base_1024(smem_raw), row_base, bar_q);
    }
  }
#endif
#endif
  plan_block<Cfg>(p, item, &s_plan);
  if (item >= s_plan.num_items) {
#ifndef VA_Q_FRAGMENT_LOADS
#ifdef VA_Q_CP_ASYNC
    if (!Cfg::kPipeQK) cp_async_wait<0>();  // the copies above land before the CTA ends
#else
    int64_t row_base;
    int valid_rows;
    if (kQStagedAtEntry<Cfg> && threadIdx.x == 32 && guess_q_rows(p, item, Cfg::kM, row_base, valid_rows))
      mbar_wait(bar_q, 0);  // the copies above land before the CTA ends
#endif
#endif
    return;
  }

  extern __shared__ __align__(16) unsigned char smem_raw[];  // aligned to 1024 B below
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = smem_base_1024(smem_raw);
  const uint32_t sKV = base + Cfg::kKVOff, sP = base + Cfg::kPOff, sQs = base + Cfg::kQSmemOff;
  float* sAlpha = reinterpret_cast<float*>(smem_raw + (base - raw) + Cfg::kAlphaOff);
  float* sStat = reinterpret_cast<float*>(smem_raw + (base - raw) + Cfg::kStatOff);
  float2* sSum = reinterpret_cast<float2*>(smem_raw + (base - raw) + Cfg::kSumOff);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wg = warp / 4;
  __shared__ WorkItem s_item;
  constexpr int kPBufs = Cfg::kPBufs;
  __shared__ __align__(8) uint64_t s_bar_p_ready[kPBufs];  // one per P buffer
  const uint32_t bar_p_ready = smem_addr(s_bar_p_ready);
  // kPipeQK: PV of a tile done with its P buffer (WG1/WG2 -> WG0): mbarriers, one per buffer,
  // since the PV warpgroups may finish a tile while WG0 has not yet waited for the one before;
  // and a stage's tile landed, completed by the gathering threads' own cp.async (WG1/WG2 -> WG0).
  constexpr bool kPipe = Cfg::kPipeQK;
  __shared__ __align__(8) uint64_t s_bar_pv_done[kPipe ? kPBufs : 1];
  __shared__ __align__(8) uint64_t s_bar_full[kPipe ? kStages : 1];
  const uint32_t bar_pv_done = smem_addr(s_bar_pv_done), bar_full = smem_addr(s_bar_full);
#ifndef VA_Q_FRAGMENT_LOADS
  // WG0 has read its fragments out of the staged chunks in the KV stages (WG0 -> WG1/WG2, once):
  // v41's loop in the mbarrier it leaves unused, v52's in one of dynamic shared memory (v68).
  const uint32_t bar_q_read = kPipe ? base + Cfg::kQReadBarOff : bar_full;
#endif
  if (tid == 0) {
    s_item = decode_item<kM>(p, s_plan, item);
#ifndef VA_Q_FRAGMENT_LOADS
    if constexpr (!kPipe || kQStagedAtEntry<Cfg>) mbar_init(bar_q_read, 128);
#endif
#pragma unroll
    for (int b = 0; b < kPBufs; ++b) mbar_init(bar_p_ready + 8 * b, 32);  // the 32 WG0 threads that write rescale factors, once per tile
    if constexpr (kPipe) {
#pragma unroll
      for (int b = 0; b < kPBufs; ++b) mbar_init(bar_pv_done + 8 * b, 256);  // WG1 + WG2's threads, once per tile
#pragma unroll
      for (int st = 0; st < kStages; ++st) mbar_init(bar_full + 8 * st, 256);  // WG1 + WG2's threads, per tile
    }
    if (item == 0) __threadfence();  // plan_block's entries (written before its barrier), then:
  }
  __syncthreads();
  if (item == 0) allow_dependent_launch();  // the combine
  const WorkItem& w = s_item;
  const int num_tiles = ceil_div(w.kv_end - w.kv_begin, kBN);

  if (wg == 0) {
    // ================= WG0: S, online softmax =================
    setmaxnreg_inc<Cfg::kRegsS>();
    const int r_lo = accumulator_row();
    uint32_t qa[Cfg::kQRegSteps][4];
#ifndef VA_Q_FRAGMENT_LOADS
    // One request: Q was staged at entry (again here if its guessed rows are not the item's, a call
    // whose indptrs disagree with q's extent); WG0 reads its fragments with ldmatrix and frees the
    // staging rows for tiles 1 and up. On v41's loop batches load the fragments directly, below:
    // their rows are known only now, and staging them would hold tiles 1 and up back
    // (kernel/NOTES.md, v61); v52's loop stages them too (v69).
    int64_t row_base = -1;
    int valid_rows = -1;
#ifndef VA_Q_CP_ASYNC
    if constexpr (kPipe && kQStagedAtEntry<Cfg>) {
      // v69: every call's Q into the staged chunks, and WG0's fragments from one ldmatrix site
      // (two sources of its Q registers made ptxas schedule its tile loop anew, v68): a single
      // request's copies went out at entry; a batch's go now that its rows are known.
      const bool early = guess_q_rows(p, item, kM, row_base, valid_rows);
      if (p.q_tma) {
        if (!early && tid == 0) stage_q_tma<Cfg>(p, base, w.q_row_base, bar_q);
        mbar_wait(bar_q, 0);
        if (early && row_base != w.q_row_base) {
          named_bar_sync(kBarS, 128);  // as below (v67)
          if (tid == 0) stage_q_tma<Cfg>(p, base, w.q_row_base, bar_q);
          mbar_wait(bar_q, 1);
        }
      } else {
        stage_q_cp_async_swizzled<Cfg>(p, base, w.q_row_base, w.valid_rows, tid);
        cp_async_commit();
        cp_async_wait<0>();
        fence_proxy_async();
        named_bar_sync(kBarS, 128);  // all of WG0's rows of Q in shared memory landed
      }
      ldmatrix_q_fragments_swizzled<Cfg>(qa, base, warp, lane);
      mbar_arrive(bar_q_read);  // KV stage 2 free for its tile
    } else
#endif
    if (kQStagedAtEntry<Cfg> && guess_q_rows(p, item, kM, row_base, valid_rows)) {
#ifdef VA_Q_CP_ASYNC
      if (row_base != w.q_row_base || valid_rows != w.valid_rows) {
        // Every thread's copies of the guessed rows land before any thread writes those bytes
        // again (another thread's, as the copies are dealt out differently).
        cp_async_wait<0>();
        named_bar_sync(kBarS, 128);
        stage_q<Cfg>(p, base, w.q_row_base, w.valid_rows, tid);
      }
      cp_async_wait<0>();
      fence_proxy_async();
      named_bar_sync(kBarS, 128);  // all of WG0's rows of Q in shared memory landed
      ldmatrix_q_fragments<Cfg>(qa, base, warp, lane);
#else
      mbar_wait(bar_q, 0);  // the guessed rows landed
      if (row_base != w.q_row_base) {
        // The item's rows differ (a call whose indptrs disagree with q's extent): copied again
        // over the landed ones, which no thread has read yet, on the barrier's next phase. Only
        // once every thread has seen phase 0 end: a thread still in its first wait when phase 1
        // ends would take the barrier's parity for phase 0 not done and wait forever
        // (racecheck's scheduling hung there; kernel/NOTES.md, v67).
        named_bar_sync(kBarS, 128);
        if (tid == 0) stage_q_tma<Cfg>(p, base, w.q_row_base, bar_q);
        mbar_wait(bar_q, 1);
      }
      ldmatrix_q_fragments_swizzled<Cfg>(qa, base, warp, lane);
#endif
      mbar_arrive(bar_q_read);  // the KV stages that held Q free for their tiles
    } else
#endif
    {
#ifndef VA_Q_FRAGMENT_LOADS
      if constexpr (!kPipe) mbar_arrive(bar_q_read);  // nothing staged in KV stages 1..
#endif
      copy_q_smem_dims<Cfg>(p, sQs, w.q_row_base, w.valid_rows, tid);  // two threads a row
      cp_async_commit();
      load_q_fragments(qa, p.q, w, r_lo, lane);
      cp_async_wait<0>();
      fence_proxy_async();
      named_bar_sync(kBarS, 128);  // all of WG0's rows of Q in shared memory landed
    }
    // Running max in registers; each thread's partial row sums (its 8 keys of a tile, quad-summed
    // at the end) in shared memory: the two registers are what the masked path needs next to Q.
    float m_lo = -INFINITY, m_hi = -INFINITY;
    sSum[tid] = make_float2(0.f, 0.f);
    // From the work item once, so that each tile's mask test needs no load of it.
    const int first_masked = first_masked_tile(w, kBN);
    // The softmax of tile `tile` from its scores s, and the hand-off of its P (and, with the last
    // tile, of the row statistics) to the PV warpgroups (softmax_handoff below picks `masked`).
    // With `masked` (a constant at each call), the softmax sees -inf where the row's visibility bits
    // (vis_lo, vis_hi) hide a key. The scores are never written: the next tile's QK is in flight
    // into the other accumulator set, and ptxas serializes wgmma around any write to an
    // accumulator register there.
    // With next >= 0, the softmax issues QK of tile `next` into nxt in kNT + 1 parts between its
    // steps (before the row max, then after each n8 tile's exponentials): a wgmma issue stalls
    // until the tensor pipe takes it, so the 36 issued at once would hold WG0 for as long as the
    // pipe is busy with PV (kernel/NOTES.md, v50-v52).
    auto softmax_handoff_with = [&](const float (&s)[kNT][4], int tile, bool masked, uint64_t vis_lo,
                                    uint64_t vis_hi, float (&nxt)[kNT][4], int next) {
      auto issue_part = [&](int part) {
        if constexpr (kPipe) {
          constexpr int kParts = kNT + 1, kSteps = 36, kPer = (kSteps + kParts - 1) / kParts;
          if (next >= 0)
            qk_tile_rs_issue_steps<kNT, Cfg::kChunkBytes>(nxt, qa, sQs, sKV + (next % kStages) * Cfg::kTileBytes,
                                                          part * kPer, min(kPer, kSteps - part * kPer));
        }
      };
      issue_part(0);
      auto score = [&](int j, int e) {
        return !masked || key_visible_bit(vis_lo, vis_hi, j, e) ? s[j][e] : -INFINITY;
      };
      // Row maxima of the raw scores as a pairwise tree (depth 4 for 48 keys; a linear chain was 12
      // dependent steps on WG0's chain, kernel/NOTES.md v41), then scaled (the scale is positive);
      // the scale is folded into the exponent's FMA below.
      float a_lo[kNT], a_hi[kNT];
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        a_lo[j] = fmaxf(score(j, 0), score(j, 1));
        a_hi[j] = fmaxf(score(j, 2), score(j, 3));
      }
#pragma unroll
      for (int d = 1; d < kNT; d *= 2)
#pragma unroll
        for (int j = 0; j + d < kNT; j += 2 * d) {
          a_lo[j] = fmaxf(a_lo[j], a_lo[j + d]);
          a_hi[j] = fmaxf(a_hi[j], a_hi[j + d]);
        }
      float mx_lo = a_lo[0], mx_hi = a_hi[0];
      quad_max(mx_lo, mx_hi);
      const float scale = p.scale_log2;
      mx_lo = fmaxf(m_lo, mx_lo * scale);
      mx_hi = fmaxf(m_hi, mx_hi * scale);
      // The reference max moves only past the threshold (kernel/NOTES.md, v12): alpha is then 1
      // exactly on most tiles, and the PV warpgroups skip their rescale.
      float alpha_lo, alpha_hi;
      advance_max_threshold(m_lo, m_hi, mx_lo, mx_hi, alpha_lo, alpha_hi);
      const float ref_lo = row_ref(m_lo), ref_hi = row_ref(m_hi);
      float sum_lo = 0.f, sum_hi = 0.f;
      uint32_t pk[kNT][2];
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        const float p0 = fast_exp2(fmaf(score(j, 0), scale, -ref_lo));
        const float p1 = fast_exp2(fmaf(score(j, 1), scale, -ref_lo));
        const float p2 = fast_exp2(fmaf(score(j, 2), scale, -ref_hi));
        const float p3 = fast_exp2(fmaf(score(j, 3), scale, -ref_hi));
        sum_lo += p0 + p1;
        sum_hi += p2 + p3;
        pk[j][0] = pack_bf16(p0, p1);
        pk[j][1] = pack_bf16(p2, p3);
        if (j % 2 == 1)
          store_p_x4(sP + (tile % kPBufs) * 64 * 128, (warp % 4) * 16, j / 2, lane, pk[j - 1][0], pk[j - 1][1], pk[j][0], pk[j][1]);
        issue_part(j + 1);
      }
      {
        const float2 l0 = sSum[tid];
        float l_lo = l0.x * alpha_lo + sum_lo, l_hi = l0.y * alpha_hi + sum_hi;
        sSum[tid] = make_float2(l_lo, l_hi);
        if (tile == num_tiles - 1) {
          // The final row statistics travel with the last tile's P, through the same hand-off.
          quad_sum(l_lo, l_hi);
          if (lane % 4 == 0) {
            sStat[r_lo] = m_lo;
            sStat[r_lo + 8] = m_hi;
            sStat[64 + r_lo] = l_lo;
            sStat[64 + r_lo + 8] = l_hi;
          }
        }
      }
      if (lane % 4 == 0) {
        sAlpha[(tile % kPBufs) * 64 + r_lo] = alpha_lo;
        sAlpha[(tile % kPBufs) * 64 + r_lo + 8] = alpha_hi;
      }
      fence_proxy_async();
      // The warp's P is complete after __syncwarp; the lanes that wrote rescale factors (and, with
      // the last tile, the row statistics) then arrive: their release covers their own writes and,
      // through the warp barrier, their warp's P (read by wgmma after the wait).
      __syncwarp();
      if (lane % 4 == 0) mbar_arrive(bar_p_ready + 8 * (tile % kPBufs));
    };
    // A masked tile's visibility bits for this thread's two rows (its keys are pos0 + 8 j + 0/1,
    // j < kNT: 42 keys).
    auto visibility = [&](int tile, uint64_t& vis_lo, uint64_t& vis_hi) {
      static_assert(8 * (kNT - 1) + 2 <= 64, "a thread's keys of a tile fit one 64-key window");
      const int pos0 = w.kv_begin + tile * kBN + (lane % 4) * 2;
      const int tok_lo = row_token(w, r_lo, p.num_heads), tok_hi = row_token(w, r_lo + 8, p.num_heads);
      vis_lo = visible_window(w, pos0, tok_lo);
      vis_hi = visible_window(w, pos0, tok_hi);
    };
    auto softmax_handoff = [&](float (&s)[kNT][4], int tile, float (&nxt)[kNT][4], int next) {
      uint64_t vis_lo, vis_hi;
      if constexpr (kPipe) {
        if (tile >= first_masked) {  // tile_needs_mask(w, w.kv_begin + tile * kBN, kBN), without loading w
          visibility(tile, vis_lo, vis_hi);
          softmax_handoff_with(s, tile, true, vis_lo, vis_hi, nxt, next);
        } else {
          softmax_handoff_with(s, tile, false, 0, 0, nxt, next);
        }
      } else {
        // No wgmma is in flight here: the masked keys' scores are set to -inf in place.
        if (tile >= first_masked) {  // tile_needs_mask(w, w.kv_begin + tile * kBN, kBN), without loading w
          visibility(tile, vis_lo, vis_hi);
#pragma unroll
          for (int j = 0; j < kNT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              if (!key_visible_bit(vis_lo, vis_hi, j, e)) s[j][e] = -INFINITY;
        }
        softmax_handoff_with(s, tile, false, 0, 0, nxt, next);
      }
    };
    auto qk_landed = [&](int tile) {
      if constexpr (kPipe) {
        mbar_wait(bar_full + 8 * (tile % kStages), (tile / kStages) & 1);  // tile landed
        fence_proxy_async();  // the gathers' cp.async writes, before this warpgroup's wgmma reads them
      } else {
        named_bar_sync(kBarFull + tile % kStages, kThreads);  // tile landed
      }
    };
    auto qk_issue = [&](float (&s)[kNT][4], int tile) {
      qk_landed(tile);
      qk_tile_rs_issue<kNT, Cfg::kChunkBytes>(s, qa, sQs, sKV + (tile % kStages) * Cfg::kTileBytes);
    };
    if constexpr (kPipe) {
      // QK of tile i + 1 goes out during the softmax of tile i, into the other accumulator set, so
      // the tensor cores run it while WG0 computes and hands over P of tile i; P goes to the buffer
      // of its tile's parity, which PV of tile i - 2 must be done with. Unrolled by two: the sets
      // trade roles without register moves. The waits come before the softmax that issues QK: a
      // thread's spin on an mbarrier with wgmma in flight makes ptxas serialize the wgmma (a
      // compiler-inserted wait in a divergent path).
      auto pv_done_wait = [&](int tile) {
        if (tile >= 2) mbar_wait(bar_pv_done + 8 * (tile % 2), (tile / 2 - 1) & 1);
      };
      float sa[kNT][4], sb[kNT][4];
      qk_issue(sa, 0);
      wgmma_wait<0>();
      fence_regs(sa);
      for (int tile = 0; tile < num_tiles; tile += 2) {
        pv_done_wait(tile);
        if (tile + 1 < num_tiles) qk_landed(tile + 1);
        softmax_handoff(sa, tile, sb, tile + 1 < num_tiles ? tile + 1 : -1);
        if (tile + 1 >= num_tiles) break;
        wgmma_wait<0>();
        fence_regs(sb);
        pv_done_wait(tile + 1);
        if (tile + 2 < num_tiles) qk_landed(tile + 2);
        softmax_handoff(sb, tile + 1, sa, tile + 2 < num_tiles ? tile + 2 : -1);
        if (tile + 2 >= num_tiles) break;
        wgmma_wait<0>();
        fence_regs(sa);
      }
      wgmma_wait<0>();  // nothing is in flight here; said so, or ptxas adds a wait of its own
    } else {
      for (int tile = 0; tile < num_tiles; ++tile) {
        float s[kNT][4];
        qk_issue(s, tile);
        // The previous tile's PV done with P (this tile's P overwrites it): waited for while QK runs,
        // off WG0's chain (kernel/NOTES.md, v13).
        if (tile > 0) named_bar_sync(kBarPVDone, kThreads);
        wgmma_wait<0>();
        fence_regs(s);
        softmax_handoff(s, tile, s, -1);
      }
      named_bar_sync(kBarPVDone, kThreads);  // the last tile's PV (num_tiles >= 1: a split has keys)
    }
  } else {
    // ================= WG1 / WG2: gather, O += P V =================
    setmaxnreg_dec<Cfg::kRegsPV>();
    const int r_lo = accumulator_row();
    const int half = wg - 1;
    const int ptid = tid - 128 * wg;                 // 0..127 within the warpgroup
    // Gather: eight threads a KV row (copy_row_line); rows ld_row + 16 k, k < kBN / 16 (fetch_slots:
    // -1 where the row is past the split).
    const uint64_t kv_policy = l2_evict_first_policy();
    auto fetch_slot = [&](int tile, int r) -> int {
      const int pos = w.kv_begin + tile * kBN + r;
      return tile < num_tiles && pos < w.kv_end ? __ldg(p.kv_indices + pos) : -1;
    };
    constexpr int kRowsPer = kBN / 16;
    struct Slots {
      int v[kRowsPer];
    };
    const int ld_row = ptid / 8, ld_u = ptid % 8;
    auto fetch_slots = [&](int tile) -> Slots {
      Slots s;
#pragma unroll
      for (int k = 0; k < kRowsPer; ++k) s.v[k] = fetch_slot(tile, ld_row + 16 * k);
      return s;
    };
    // Rows ld_row + 16 k of a tile; rows past the split, and slots outside the pool, are
    // zero-filled (as load_tile above says).
    auto load_rows = [&](int slot, int k, int stage) {
      const bool ok = slot >= 0 && slot < p.num_slots;
      const __nv_bfloat16* src = p.kv + (ok ? static_cast<int64_t>(slot) * kQKDim : 0);
      copy_row_line<Cfg::kChunkBytes>(sKV + stage * Cfg::kTileBytes, ld_row + 16 * k, ld_u, half, src, ok, kv_policy);
    };
    auto load_tile = [&](const Slots& slots, int stage) {
#pragma unroll
      for (int k = 0; k < kRowsPer; ++k) load_rows(slots.v[k], k, stage);
    };
    // Tile 0 alone first: at the start every SM's L2 -> SM bandwidth is what limits, so tile 0
    // (and WG0's Q) land before tiles 1.. are asked for.
    load_tile(fetch_slots(0), 0);  // num_tiles >= 1
    if constexpr (kPipe)
      cp_async_mbar_arrive(bar_full);
    else
      cp_async_commit();
    float o[32][4];
#pragma unroll
    for (int j = 0; j < 32; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    if constexpr (kPipe) {
      mbar_wait(bar_full, 0);
#ifndef VA_Q_FRAGMENT_LOADS
      // Q's staged chunks sit in the last stage (v68-v69): tiles 1.. are gathered once WG0 has
      // read them, which for a single request it has by the time tile 0 lands. (A wait between
      // tile 1's gather and tile 2's, in the loop below, made ptxas schedule this warpgroup's tile
      // loop anew.)
      if (kQStagedAtEntry<Cfg>) mbar_wait(bar_q_read, 0);  // every call's Q is staged there (v69)
#endif
#pragma unroll 1
      for (int t = 1; t < kStages && t < num_tiles; ++t) {
        load_tile(fetch_slots(t), t);
        cp_async_mbar_arrive(bar_full + 8 * t);
      }
    } else {
      cp_async_wait<0>();
      fence_proxy_async();
      named_bar_arrive(kBarFull + 0, kThreads);
#ifndef VA_Q_FRAGMENT_LOADS
      mbar_wait(bar_q_read, 0);  // Q's staging rows read (kernel/NOTES.md, v60)
#endif
#pragma unroll 1
      for (int t = 1; t < kStages; ++t) {
        if (t < num_tiles) load_tile(fetch_slots(t), t);
        cp_async_commit();
      }
    }
    for (int tile = 0; tile < num_tiles; ++tile) {
      const auto next_slots = fetch_slots(tile + kStages);  // consumed under this tile's PV
      if constexpr (kPipe) {
        // P, rescale factors (and row statistics) of this tile
        mbar_wait(bar_p_ready + 8 * (tile % kPBufs), (tile / kPBufs) & 1);
        // V landed before WG0 took the tile (its wait on the stage's barrier, which this wait
        // follows); the cp.async writes, before this warpgroup's wgmma reads them.
        fence_proxy_async();
      } else {
        // The next tile (gathered kStages - 1 tiles ago) should have landed; WG0 may start its QK
        // before it hands over this tile's P.
        cp_async_wait<kStages - 2>();
        fence_proxy_async();
        if (tile + 1 < num_tiles) named_bar_arrive(kBarFull + (tile + 1) % kStages, kThreads);
        mbar_wait(bar_p_ready, tile & 1);  // P, rescale factors (and row statistics) of this tile
      }
      const float alpha_lo = sAlpha[(tile % kPBufs) * 64 + r_lo], alpha_hi = sAlpha[(tile % kPBufs) * 64 + r_lo + 8];
      rescale_o_lazy(o, alpha_lo, alpha_hi);
      const uint32_t sK = sKV + (tile % kStages) * Cfg::kTileBytes;
      // PV's k-step k reads V rows 16 k .. 16 k + 15 of this warpgroup's chunks, the rows
      // ld_row + 16 k that its gather writes: the next gather's row group k goes out as soon as
      // k-step k is done, under the later k-steps (kernel/NOTES.md, v39). QK of this tile finished
      // before P, so the RoPE chunk is free throughout.
      pv_tile_issue<kBN, Cfg::kChunkBytes, true>(o, sP + (tile % kPBufs) * 64 * 128, sK, half);
      const bool refill = tile + kStages < num_tiles;
#pragma unroll
      for (int k = 0; k < kRowsPer; ++k) {
        if (k < kRowsPer - 1) {
          wgmma_wait_pending(kRowsPer - 1 - k);
        } else {
          pv_tile_wait(o);
          if constexpr (kPipe)
            mbar_arrive(bar_pv_done + 8 * (tile % kPBufs));
          else
            named_bar_arrive(kBarPVDone, kThreads);
        }
        if (refill) load_rows(next_slots.v[k], k, tile % kStages);
      }
      if constexpr (kPipe) {
        if (refill) cp_async_mbar_arrive(bar_full + 8 * (tile % kStages));
      } else {
        cp_async_commit();
      }
    }
    cp_async_wait<0>();
    // Row statistics: written by WG0 before its last bar_p_ready arrive, which this warpgroup
    // waited for.
    const float m_lo = sStat[r_lo], m_hi = sStat[r_lo + 8];
    const float l_lo = sStat[64 + r_lo], l_hi = sStat[64 + r_lo + 8];
    if (w.num_splits > 1)
      store_partial_half(p, w, o, m_lo, m_hi, l_lo, l_hi, r_lo, half, ptid, smem_raw + (base - raw),
                         kBarEpilogue);
    else
      store_rows<kM>(p, w, o, m_lo, m_hi, l_lo, l_hi, r_lo, half * 256 + (lane % 4) * 2, half == 0);
  }
#else
  __trap();  // built for sm_90a only; the launcher never selects it elsewhere
#endif
}

}  // namespace va
