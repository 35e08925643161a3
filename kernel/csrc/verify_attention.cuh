// Verify attention for MLA tree drafts: torch-free kernel code.
//
// One launch = two kernels:
//   1. plan:    picks one split length L (a multiple of the KV tile) so that the work items
//               (request, prefix split, row tile) about fill the GPU once, and lays the items out.
//               Every main-kernel CTA computes it at its start, on the device, so the call never
//               syncs with the host (graph-capturable) and needs no separate launch.
//   2. main:    one CTA per work item. Rows are (draft token, head) pairs of one request, folded
//               into M-row tiles; each KV tile is gathered once (cp.async, 16-byte chunks of the
//               1152-byte rows) and used for both QK (576 dims) and PV (first 512 dims).
//   3. combine: merges the splits of each row in a fixed order (bitwise deterministic).
//
// Warp layout of the main kernel: warps come in row groups of 2 (`large`) or 4 (`small`,
// `small-m32`); the warps of a group own the same 16 rows. Each computes the partial S = Q K^T
// (mma.sync m16n8k16 bf16) of all the tile's keys over its share of the 576 dims; the group adds
// the partials through shared memory, and each warp holds P in registers as the A operand of its
// P V over its share of V's 512 dims, kept in registers (16 x 256 fp32 = 128 registers a thread
// with 2 warps a group, 64 with 4). Splitting S's work in the group instead of computing it in
// every warp saved a third of the mma work (kernel/NOTES.md, v1 -> v2); splitting its dims rather
// than its keys cuts the Q and K each warp loads (v23); with 4 warps a group Q lives in registers
// (36 a thread) and its shared memory holds larger KV tiles (v24), and each warp computes the
// softmax of a quarter of the tile's keys, the group trading P, and the row maxima only on tiles
// where one passes its reference by more than a threshold (v25-v26).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace va {

constexpr int kQKDim = 576;  // 512 latent + 64 RoPE
constexpr int kVDim = 512;
constexpr int kChunksPerRow = kQKDim * 2 / 16;  // 72 chunks of 16 bytes per KV / Q row
// +8 bf16 per shared-memory row: a 1168-byte stride puts the 8 rows of an ldmatrix phase on
// distinct 4-bank groups, so both the plain and the transposed loads are conflict-free.
constexpr int kSmemRow = kQKDim + 8;
constexpr float kLn2 = 0.6931471805599453f;

// Tile configuration. kRowGroups x 16 rows per CTA, kDimSplit warps per row group: each warp of a
// row group computes QK over 576 / kDimSplit of the dims and owns 512 / kDimSplit of O's dims. With
// 4 warps a row group, Q lives in registers (36 a thread) instead of shared memory.
template <int kRowGroups_, int kBlockN_, int kStages_, int kQKSets_ = 1, int kDimSplit_ = 2>
struct Config {
  static constexpr int kRowGroups = kRowGroups_;
  static constexpr int kBlockN = kBlockN_;  // keys per KV tile
  static constexpr int kStages = kStages_;  // cp.async pipeline depth
  // Accumulators per n8 tile of S over interleaved k-steps: QK's 36 / kDimSplit dependent mma of a
  // warp's share of the dims become kQKSets chains (kernel/NOTES.md, v23; one set with 4 warps a
  // row group, v24).
  static constexpr int kQKSets = kQKSets_;
  static constexpr int kMinSplitKeys = 64;  // a split holds at least this many keys (kernel/NOTES.md, v21)
  static constexpr int kDimSplit = kDimSplit_;
  static constexpr bool kQInRegisters = kDimSplit == 4;
  static constexpr int kM = 16 * kRowGroups;
  static constexpr int kWarps = kDimSplit * kRowGroups;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kQSmemRows = kQInRegisters ? 0 : kM;
  static constexpr int kKVBytes = (kQSmemRows + kStages * kBlockN) * kSmemRow * 2;
  // Each warp's partial S tile (16 rows x kBlockN keys, fp32, accumulator layout) for its row group.
  static constexpr int kExBytes = kWarps * kBlockN * 64;
  static constexpr int kSmemBytes = kKVBytes + kExBytes;
  // With 4 warps a row group each warp computes the softmax of its share of S's n8 tiles; the group
  // trades P (and the row maxima where they move) through the exchange (kernel/NOTES.md, v25-v26).
  static constexpr bool kSoftmaxShared = kDimSplit == 4;
  static_assert(kBlockN % 16 == 0, "KV tile must be a multiple of the mma k-step");
  static_assert(kStages >= 2, "need at least double buffering");
  static_assert(kDimSplit == 2 || kDimSplit == 4, "2 or 4 warps a row group");
  static_assert((kQKDim / 16 / kDimSplit) % kQKSets == 0, "a warp's k-steps must divide among the sets");
};

// Large-shared-memory parts (sm_80, sm_90, sm_100: >= 160 KB per block).
using ConfigLarge = Config<4, 32, 2>;   // M=64, 8 warps, 162 KB
// sm_120 / sm_86 / sm_89: 99 KB per block, ~100 KB per SM. Two shapes, chosen per call
// (make_plan, kernel/NOTES.md v21-v24; timed on the H200 through config="small" / "small-m32",
// not on sm_120). Both have four warps a row group with Q in registers, which frees Q's shared
// memory for 32-key tiles: 9-11 % faster than 16-key tiles with Q in shared memory where the loop
// binds (v24).
// `small`, M=48, 12 warps, 32-key tiles in 2 stages, 97 KB: each KV tile used by 48 rows; ~12 %
// faster than M=32 where rows are many.
using ConfigSmall = Config<3, 32, 2, 1, 4>;
// `small-m32`, M=32, 8 warps, 32-key tiles in 2 stages, 91 KB: no padding tile and fewer splits a
// row where rows are few.
using ConfigSmallM32 = Config<2, 32, 2, 1, 4>;

// small-m32 over small (kernel/NOTES.md, v24, refitted in v25-v27): the shape whose busiest SM
// costs less, as the plan lays the call out, in row x key products: a row of M=32 counts
// kM32RowCost rows of M=48 (its loop costs more a row), and M=48's fixed part (12 warps against 8,
// a larger work item) counts as kM32FixedKeys more keys of a 48-row tile. Fitted to the H200's
// sm120 grid of v27's kernels (a line through each shape's 128-row calls, P = 4k..200k: ~1.19
// times the per-row-key time and ~3.6 us, ~59 keys, more fixed cost for M=48); every (weight,
// keys) from (1.14, 10-20) to (1.3, 120-200) picks the faster shape on all 27 calls, and a
// weight alone at best misses 3 of them by 2.7-4.7 % (1.1) or the short P=4k H=8 T=16 by
// 15 % (from 1.13). Plan layout: ceil(rows / M) row tiles; with fewer tiles than SMs each is split
// into up to SMs / tiles splits of at least kMinSplitKeys keys, else unsplit in ceil(tiles / SMs)
// waves. So M=32 where it pads fewer rows and the call is short, or fills more SMs (4096 rows on
// 132 SMs: 128 tiles against 86), M=48 where its tiles share each KV tile among more rows at the
// same fill. Totals over the batch: the host knows no request's own lengths.
constexpr double kM32RowCost = 1.2;
constexpr long long kM32FixedKeys = 60;
// Build switch VA_SMALL_SHAPE: 0 this rule, 48 always small, 32 always small-m32 (the A/B bases
// that time the rule on a box that runs these kernels).
#ifndef VA_SMALL_SHAPE
#define VA_SMALL_SHAPE 0
#endif
static_assert(VA_SMALL_SHAPE == 0 || VA_SMALL_SHAPE == 32 || VA_SMALL_SHAPE == 48, "VA_SMALL_SHAPE: 0, 32 or 48");
// Row x key products on the busiest SM for M-row tiles, a row weighted by row_cost.
inline double busiest_sm_work(long long rows, long long keys, int sms, long long m, double row_cost) {
  const long long tiles = (rows + m - 1) / m;
  if (sms < 1) sms = 1;
  if (tiles >= sms) return row_cost * m * keys * ((tiles + sms - 1) / sms);
  const long long min_split = ConfigSmall::kMinSplitKeys;
  long long splits = sms / tiles, most = (keys + min_split - 1) / min_split;
  if (splits > most) splits = most;
  if (splits < 1) splits = 1;
  return row_cost * m * ((keys + splits - 1) / splits);
}
inline bool prefer_small_m32(long long rows, long long num_kv_indices, int sms) {
#if VA_SMALL_SHAPE == 48
  return false;
#elif VA_SMALL_SHAPE == 32
  return true;
#else
  static_assert(ConfigSmall::kMinSplitKeys == ConfigSmallM32::kMinSplitKeys, "one minimum split for both shapes");
  return busiest_sm_work(rows, num_kv_indices, sms, ConfigSmallM32::kM, kM32RowCost) <
         busiest_sm_work(rows, num_kv_indices, sms, ConfigSmall::kM, 1.0) +
             static_cast<double>(ConfigSmall::kM * kM32FixedKeys);
#endif
}

struct Params {
  const __nv_bfloat16* q;             // [N, H, 576]
  const __nv_bfloat16* kv;            // [S, 576]
  const int32_t* kv_indices;          // [K]
  const int32_t* qo_indptr;           // [B+1]
  const int32_t* kv_indptr;           // [B+1]
  const int32_t* tree_mask;           // packed words, see kernel/tree_mask.py
  const int32_t* tree_mask_indptr;    // [B+1]
  __nv_bfloat16* out;                 // [N, H, 512]
  float* lse;                         // [N, H]
  // workspace: the plan as CTA 0 of the main kernel publishes it (the combine reads num_splits and
  // partial_base; plan and item_prefix are kept for inspecting a launch)
  int32_t* plan;                      // [2]: split length L, number of work items
  int32_t* item_prefix;               // [B+1] exclusive prefix of items per request
  int32_t* partial_base;              // [B]   first partial slot of a split request, -1 if unsplit
  int32_t* num_splits;                // [B]
  float* partial_o;                   // [max_partials, M, 512] normalised partial outputs (fp32;
                                      // fp16 + scales for wgmma-ws: half_partials)
  float* partial_lse;                 // [max_partials, M]      natural-log lse of each partial
  int batch;
  int num_heads;
  int num_slots;
  int num_q_rows;                     // N * H
  int num_kv_indices;                 // K
  float scale_log2;                   // sm_scale * log2(e)
  int max_items;                      // grid size of the main kernel
  int max_partials;                   // target items: splitting stops at this many
  int min_split_tiles;                // a split holds at least this many KV tiles
  // q as a 2-D tensor map (CUtensorMap: [N*H rows][576] bf16, 64 x 64 boxes, 128-byte swizzle)
  // for the wgmma-ws kernels' bulk tensor copies of Q (kernel/NOTES.md, v67-v69). q_tma = 0 when
  // the host has none: wgmma-ws then loads Q's fragments directly, wgmma-ws-pipe copies Q by
  // cp.async into the same layout.
  int q_tma;
  alignas(64) uint64_t q_map[16];
};

// ---------------------------------------------------------------------------------------------
// PTX wrappers
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared (dst a shared-memory address), zero-filling when !valid
// (no bytes are read then).
__device__ __forceinline__ void cp_async_16_shared(uint32_t dst, const void* src, bool valid) {
  int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  cp_async_16_shared(smem_addr(dst), src, valid);
}
// 4-byte async copy global -> shared, zero-filling when !valid.
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// The KV gathers' L2 policy: evict_first. A KV tile is read by its row tiles' CTAs at about the
// same time and never again, so its lines may go before anything else. With the default policy
// the wgmma-ws kernel's H=8 T=16 calls run 3-5 us longer and its loop-bound ones 2-3 %
// (kernel/NOTES.md v14); the mma.sync kernels' calls ~1 % longer on the H200 (v16).
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
// cp_async_16_shared with an L2 cache policy (zero-filling when !valid).
__device__ __forceinline__ void cp_async_16_evict_first(uint32_t dst, const void* src, bool valid, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0), "l"(policy));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// Barrier for the kWarps warps of one row group (ids 1.. ; 0 is __syncthreads).
template <int kWarps>
__device__ __forceinline__ void group_barrier(int group) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(group + 1), "n"(kWarps * 32));
}

// D = A * B + D, m16n8k16, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Reductions over the 4 lanes that hold one accumulator row (lane / 4 equal), for a thread's two
// rows (r and r + 8 of the mma / wgmma accumulator layout).
__device__ __forceinline__ void quad_max(float& lo, float& hi) {
#pragma unroll
  for (int o = 1; o < 4; o <<= 1) {
    lo = fmaxf(lo, __shfl_xor_sync(0xffffffffu, lo, o));
    hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
  }
}
__device__ __forceinline__ void quad_sum(float& lo, float& hi) {
#pragma unroll
  for (int o = 1; o < 4; o <<= 1) {
    lo += __shfl_xor_sync(0xffffffffu, lo, o);
    hi += __shfl_xor_sync(0xffffffffu, hi, o);
  }
}

// The max a row's scores are exponentiated against: 0 for a row that has seen only masked keys
// (max -inf), so that exp2 gives 0 and not NaN.
__device__ __forceinline__ float row_ref(float m) { return m == -INFINITY ? 0.f : m; }

// The online-softmax step of a thread's two rows (r and r + 8) once their new running maxima are
// known: the max to subtract from the tile's scores (row_ref), the factor that rescales what was
// accumulated against the old max m, and m = mx.
__device__ __forceinline__ void advance_max(float& m_lo, float& m_hi, float mx_lo, float mx_hi, float& ref_lo,
                                            float& ref_hi, float& alpha_lo, float& alpha_hi) {
  ref_lo = row_ref(mx_lo);
  ref_hi = row_ref(mx_hi);
  alpha_lo = fast_exp2(m_lo - ref_lo);
  alpha_hi = fast_exp2(m_hi - ref_hi);
  m_lo = mx_lo;
  m_hi = mx_hi;
}

// The same step where a row's reference max moves only when the row max passes it by more than
// kRescaleThreshold (log2 units; the wgmma-ws kernel since v12, the 4-warp mma.sync kernels since
// v26): until then P = exp2(s - m) stays below 2^threshold and alpha is exactly 1, so the rescale
// of O can be skipped. m is the reference here (exponentiate against row_ref(m)).
constexpr float kRescaleThreshold = 8.f;
__device__ __forceinline__ void advance_max_threshold(float& m_lo, float& m_hi, float mx_lo, float mx_hi,
                                                      float& alpha_lo, float& alpha_hi) {
  const bool up_lo = mx_lo > m_lo + kRescaleThreshold, up_hi = mx_hi > m_hi + kRescaleThreshold;
  alpha_lo = up_lo ? fast_exp2(m_lo - mx_lo) : 1.f;
  alpha_hi = up_hi ? fast_exp2(m_hi - mx_hi) : 1.f;
  if (up_lo) m_lo = mx_lo;
  if (up_hi) m_hi = mx_hi;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// P of one n8 tile of S (a thread's four accumulator values: row lo's two, then row hi's) against
// the rows' references, as the two bf16 pairs of its share of an mma A fragment; the rows' sums
// accumulate.
__device__ __forceinline__ uint2 exp_tile(const float (&s)[4], float ref_lo, float ref_hi, float& sum_lo,
                                          float& sum_hi) {
  const float p0 = fast_exp2(s[0] - ref_lo), p1 = fast_exp2(s[1] - ref_lo);
  const float p2 = fast_exp2(s[2] - ref_hi), p3 = fast_exp2(s[3] - ref_hi);
  sum_lo += p0 + p1;
  sum_hi += p2 + p3;
  return make_uint2(pack_bf16(p0, p1), pack_bf16(p2, p3));
}

__device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Largest r in [0, n) with prefix[r] <= x (prefix non-decreasing, prefix[0] <= x).
__device__ __forceinline__ int upper_index(const int32_t* prefix, int n, int x) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) >> 1;
    if (__ldg(prefix + mid) <= x) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// ---------------------------------------------------------------------------------------------
// 1. plan: computed by every CTA of the main kernel at its start (no separate launch; the inputs
//    are a few int32 per request and the result is the same in every CTA: same data, same
//    reduction order). CTA 0 also writes it to the workspace for the combine.
// ---------------------------------------------------------------------------------------------
template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <class T>
__device__ __forceinline__ T warp_max(T v) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Inclusive scan of v over the lanes of a full warp.
__device__ __forceinline__ int warp_inclusive_scan(int v) {
  const int lane = threadIdx.x % 32;
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += n;
  }
  return v;
}

template <int kThreads, class T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
  v = warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < kThreads / 32; ++w) total += scratch[w];
  return total;
}

template <int kThreads, class T>
__device__ __forceinline__ T block_max(T v, T* scratch) {
  v = warp_max(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T m = scratch[0];
  for (int w = 1; w < kThreads / 32; ++w) m = max(m, scratch[w]);
  return m;
}

// Exclusive block-wide scan of v; returns (exclusive prefix, block total via *total).
template <int kThreads>
__device__ __forceinline__ int block_exclusive_scan(int v, int* scratch, int* total) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int inc = warp_inclusive_scan(v);
  __syncthreads();
  if (lane == 31) scratch[warp] = inc;
  __syncthreads();
  int warp_base = 0, sum = 0;
  for (int w = 0; w < kThreads / 32; ++w) {
    if (w < warp) warp_base += scratch[w];
    sum += scratch[w];
  }
  *total = sum;
  return warp_base + inc - v;
}

// Request b's bounds, loaded together where the plan reads them. (No member initialisers: a
// BlockPlan, which holds one, lives in __shared__ memory.)
struct RequestBounds {
  int q_begin, q_end;    // qo_indptr[b], qo_indptr[b + 1]
  int kv_begin, kv_end;  // kv_indptr[b], kv_indptr[b + 1]
  int mask_offset;       // tree_mask_indptr[b]
  __device__ __forceinline__ void load(const Params& p, int b) {
    q_begin = p.qo_indptr[b];
    q_end = p.qo_indptr[b + 1];
    kv_begin = p.kv_indptr[b];
    kv_end = p.kv_indptr[b + 1];
    mask_offset = p.tree_mask_indptr[b];
  }
};

// The launch's plan as one CTA needs it: the split length, the item count, and the request that
// holds this CTA's item.
struct BlockPlan {
  int split_len;     // L: keys per split, a multiple of the KV tile
  int num_items;     // work items in all (CTAs past it have nothing to do)
  int b;             // request of this CTA's item
  int item_begin;    // its first item
  int num_splits;    // its splits
  int partial_base;  // its first partial slot, -1 if unsplit
  // The request's bounds, read by the plan anyway: decode_item needs no load of its own after it
  // (kernel/NOTES.md, v30).
  RequestBounds req;
};

// The split length (in KV tiles) lies in [lo, hi]: the smallest length whose item count fits
// max_partials (item count is non-increasing in the length), or no split at all (lo = hi = the
// longest request) when the unsplit work already fills the GPU. Bracket: a length L gives between
// work / L and work / L + unsplit items (work = sum of keys x row tiles), so the answer is at least
// work / (max_partials BN) tiles and at most work / ((max_partials - unsplit) BN) tiles. One
// request: the bracket is a tile or two wide (a bisection step costs reductions over the batch).
template <class Cfg>
__device__ __forceinline__ void split_bracket(const Params& p, int max_len, int unsplit, long long work, int& lo,
                                              int& hi) {
  const int max_tiles = max(1, ceil_div(max_len, Cfg::kBlockN));
  lo = min(p.min_split_tiles, max_tiles);
  hi = max_tiles;
  if (unsplit >= p.max_partials) {
    lo = hi;
    return;
  }
  const long long per_tile = static_cast<long long>(p.max_partials) * Cfg::kBlockN;
  const long long fit_tile = static_cast<long long>(p.max_partials - unsplit) * Cfg::kBlockN;
  const long long below = (work + per_tile - 1) / per_tile, above = (work + fit_tile - 1) / fit_tile;
  lo = max(lo, static_cast<int>(below < hi ? below : hi));
  hi = max(lo, static_cast<int>(above < hi ? above : hi));
}

// Request b's place in the item and partial layout: CTA 0 publishes it for the combine, and the
// CTA whose item falls in it takes the request.
__device__ __forceinline__ void place_request(const Params& p, int item, int b, const RequestBounds& rb, int begin,
                                              int items, int splits, int pbase, BlockPlan* out) {
  if (blockIdx.x == 0) {
    p.item_prefix[b] = begin;
    p.num_splits[b] = splits;
    p.partial_base[b] = pbase;
  }
  if (item >= begin && item < begin + items) {
    out->b = b;
    out->item_begin = begin;
    out->num_splits = splits;
    out->partial_base = pbase;
    out->req = rb;
  }
}
// The launch-wide results, by one thread: split length and item count (CTA 0 also publishes them).
__device__ __forceinline__ void finish_plan(const Params& p, int L, int num_items, BlockPlan* out) {
  out->split_len = L;
  out->num_items = num_items;
  if (blockIdx.x == 0) {
    p.item_prefix[p.batch] = num_items;
    p.plan[0] = L;
    p.plan[1] = num_items;
  }
}

// The plan of plan_block below for a batch of at most 32 requests, by one warp (lane b holds
// request b): shuffles instead of block reductions, the same arithmetic and the same result.
template <class Cfg>
__device__ __forceinline__ void plan_warp(const Params& p, int item, BlockPlan* out) {
  const int lane = threadIdx.x % 32, H = p.num_heads;
  const bool has = lane < p.batch;
  int len = 0, tiles_m = 0;
  RequestBounds rb{};
  if (has) {
    rb.load(p, lane);
    len = rb.kv_end - rb.kv_begin;
    tiles_m = ceil_div((rb.q_end - rb.q_begin) * H, Cfg::kM);
  }
  const int max_len = warp_max(len);
  const int unsplit = warp_sum(tiles_m);
  const long long work = warp_sum(static_cast<long long>(len) * tiles_m);
  int lo, hi;
  split_bracket<Cfg>(p, max_len, unsplit, work, lo, hi);
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    const int items = warp_sum(has ? ceil_div(len, mid * Cfg::kBlockN) * tiles_m : 0);
    if (items <= p.max_partials) hi = mid; else lo = mid + 1;
  }
  const int L = lo * Cfg::kBlockN;
  const int splits = has ? ceil_div(len, L) : 0, items = splits * tiles_m;
  const int in_part = splits > 1 ? items : 0;
  const int item_inc = warp_inclusive_scan(items), part_inc = warp_inclusive_scan(in_part);
  const int begin = item_inc - items, total = __shfl_sync(0xffffffffu, item_inc, 31);
  if (has) place_request(p, item, lane, rb, begin, items, splits, splits > 1 ? part_inc - in_part : -1, out);
  if (lane == 0) finish_plan(p, L, total, out);
}

// Every thread of the CTA calls this; the result is in *out after it returns.
template <class Cfg>
__device__ __forceinline__ void plan_block(const Params& p, int item, BlockPlan* out) {
  constexpr int kT = Cfg::kThreads;
#ifdef VA_DELAY_PLAN_PUBLISH_NS
  // A build for tests only (tests/test_plan_order.py): CTA 0 publishes the plan's entries this
  // many nanoseconds late, so that a combine let in before they are written reads the previous
  // call's every time, not once in a while (kernel/NOTES.md, "The wgmma kernel let the combine
  // read the previous call's plan").
  if (blockIdx.x == 0) {
    uint64_t t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
      __nanosleep(1000);
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < static_cast<uint64_t>(VA_DELAY_PLAN_PUBLISH_NS));
  }
#endif
  if (p.batch <= 32) {  // one warp, no block barriers (~0.5-1.3 us less on H200, NOTES v12)
    if (threadIdx.x < 32) plan_warp<Cfg>(p, item, out);
    __syncthreads();
    return;
  }
  __shared__ int scratch[kT / 32];
  __shared__ long long scratch64[kT / 32];
  const int H = p.num_heads;
  // Largest request, number of row tiles with no split, and keys x row tiles (the work).
  int max_len = 0, unsplit = 0;
  long long work = 0;
  for (int b = threadIdx.x; b < p.batch; b += kT) {
    const int len = p.kv_indptr[b + 1] - p.kv_indptr[b];
    const int rows = (p.qo_indptr[b + 1] - p.qo_indptr[b]) * H;
    max_len = max(max_len, len);
    unsplit += ceil_div(rows, Cfg::kM);
    work += static_cast<long long>(len) * ceil_div(rows, Cfg::kM);
  }
  max_len = block_max<kT>(max_len, scratch);
  unsplit = block_sum<kT>(unsplit, scratch);
  work = block_sum<kT>(work, scratch64);

  // Smallest split length (in tiles) whose item count fits max_partials: bisect in the bracket.
  // Every thread takes the same branches (values are block-uniform).
  int lo, hi;
  split_bracket<Cfg>(p, max_len, unsplit, work, lo, hi);
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    const int L = mid * Cfg::kBlockN;
    int items = 0;
    for (int b = threadIdx.x; b < p.batch; b += kT) {
      const int len = p.kv_indptr[b + 1] - p.kv_indptr[b];
      const int rows = (p.qo_indptr[b + 1] - p.qo_indptr[b]) * H;
      items += ceil_div(len, L) * ceil_div(rows, Cfg::kM);
    }
    items = block_sum<kT>(items, scratch);
    if (items <= p.max_partials) hi = mid; else lo = mid + 1;
  }
  const int L = lo * Cfg::kBlockN;

  // Lay out items (request-major) and partial slots (only split requests use them).
  int item_base = 0, partial_base = 0;
  for (int b0 = 0; b0 < p.batch; b0 += kT) {
    const int b = b0 + threadIdx.x;
    int items = 0, splits = 0;
    RequestBounds rb{};
    if (b < p.batch) {
      rb.load(p, b);
      const int len = rb.kv_end - rb.kv_begin;
      const int rows = (rb.q_end - rb.q_begin) * H;
      splits = ceil_div(len, L);
      items = splits * ceil_div(rows, Cfg::kM);
    }
    int item_total, partial_total;
    const int item_off = block_exclusive_scan<kT>(items, scratch, &item_total);
    const int partial_off = block_exclusive_scan<kT>(splits > 1 ? items : 0, scratch, &partial_total);
    if (b < p.batch)
      place_request(p, item, b, rb, item_base + item_off, items, splits,
                    splits > 1 ? partial_base + partial_off : -1, out);
    item_base += item_total;
    partial_base += partial_total;
  }
  if (threadIdx.x == 0) finish_plan(p, L, item_base, out);
  __syncthreads();
}

// ---------------------------------------------------------------------------------------------
// Shared by the main kernels (mma.sync and wgmma): which work item a CTA runs, which keys a row
// sees, and how a finished row tile is written.
// ---------------------------------------------------------------------------------------------
struct WorkItem {
  int b;             // request
  int local;         // item index within the request: split * row_tiles + row_tile
  int num_draft;     // T_b
  int kv_begin;      // this split's keys: [kv_begin, kv_end) (global kv_indices positions)
  int kv_end;
  int draft_begin;   // global position of the request's first draft token
  int num_splits;
  int partial_base;  // first partial slot of the request (-1 if unsplit)
  int row0;          // first row of the tile within the request ((token, head) pairs, token-major)
  int valid_rows;    // rows of this tile that exist (the rest are padding)
  int mask_words;    // packed words per tree-mask row
  int64_t q_row_base;  // flattened [N*H] index of the tile's first row
  const int32_t* mask_base;
};

template <int kM>
__device__ __forceinline__ WorkItem decode_item(const Params& p, const BlockPlan& plan, int item) {
  WorkItem w;
  const int H = p.num_heads;
  w.b = plan.b;
  w.local = item - plan.item_begin;
  const int q_begin = plan.req.q_begin;
  w.num_draft = plan.req.q_end - q_begin;
  const int rows = w.num_draft * H;
  const int row_tiles = ceil_div(rows, kM);
  const int split = w.local / row_tiles, row_tile = w.local % row_tiles;
  const int kv_req_end = plan.req.kv_end;
  w.kv_begin = plan.req.kv_begin + split * plan.split_len;
  w.kv_end = min(w.kv_begin + plan.split_len, kv_req_end);
  w.draft_begin = kv_req_end - w.num_draft;
  w.num_splits = plan.num_splits;
  w.partial_base = plan.partial_base;
  w.row0 = row_tile * kM;
  w.q_row_base = static_cast<int64_t>(q_begin) * H + w.row0;
  w.valid_rows = min(kM, rows - w.row0);
  w.mask_words = (w.num_draft + 31) / 32;
  w.mask_base = p.tree_mask + plan.req.mask_offset;
  return w;
}

// Draft token of tile row r (clamped for padding rows, whose results are dropped).
__device__ __forceinline__ int row_token(const WorkItem& w, int r, int num_heads) {
  return min((w.row0 + r) / num_heads, w.num_draft - 1);
}

// Does the KV tile [t0, t0 + bn) need masking (it reaches past the split or into the drafts)?
__device__ __forceinline__ bool tile_needs_mask(const WorkItem& w, int t0, int bn) {
  return t0 + bn > w.kv_end || t0 + bn > w.draft_begin;
}
// The same rule as a tile index: tile t of the split (t0 = kv_begin + t bn) needs masking exactly
// when t >= first_masked_tile(w, bn). Computed once, it keeps the item's loads out of a tile loop
// (kernel/NOTES.md, v41).
__device__ __forceinline__ int first_masked_tile(const WorkItem& w, int bn) {
  const int x = min(w.kv_end, w.draft_begin) - bn - w.kv_begin;
  return x < 0 ? 0 : x / bn + 1;
}

// Is key position pos (global) visible to draft token tok?
__device__ __forceinline__ bool key_visible(const WorkItem& w, int pos, int tok) {
  bool visible = pos < w.kv_end;
  if (visible && pos >= w.draft_begin) {
    const int d = pos - w.draft_begin;
    const uint32_t word = static_cast<uint32_t>(__ldg(w.mask_base + tok * w.mask_words + d / 32));
    visible = (word >> (d % 32)) & 1u;
  }
  return visible;
}

// The visibility of keys pos0 .. pos0 + 63 to draft token tok as a 64-bit window (bit k: key
// pos0 + k): prefix keys (before the draft region) are visible, keys past the split are not, draft
// keys by the token's mask bits. The at most three mask words the window touches are loaded
// together, one round trip for the 64 keys instead of one a key (kernel/NOTES.md, v33).
__device__ __forceinline__ uint64_t visible_window(const WorkItem& w, int pos0, int tok) {
  const int d0 = pos0 - w.draft_begin;  // draft index of key pos0 (negative: a prefix key)
  const uint32_t* row = reinterpret_cast<const uint32_t*>(w.mask_base) + tok * w.mask_words;
  uint64_t win;
  if (d0 >= 0) {
    const int wb = d0 >> 5, sh = d0 & 31;
    const uint32_t m0 = wb < w.mask_words ? __ldg(row + wb) : 0u;
    const uint32_t m1 = wb + 1 < w.mask_words ? __ldg(row + wb + 1) : 0u;
    const uint32_t m2 = wb + 2 < w.mask_words ? __ldg(row + wb + 2) : 0u;
    win = (((static_cast<uint64_t>(m1) << 32) | m0) >> sh) | (sh ? static_cast<uint64_t>(m2) << (64 - sh) : 0ull);
  } else if (d0 > -64) {
    const int n = -d0;  // prefix keys first, then draft keys 0 .. 63 - n (words 0 and 1)
    const uint32_t m0 = __ldg(row), m1 = w.mask_words > 1 ? __ldg(row + 1) : 0u;
    win = (((static_cast<uint64_t>(m1) << 32) | m0) << n) | ((1ull << n) - 1);
  } else {
    win = ~0ull;  // all 64 keys before the draft region
  }
  const int lim = w.kv_end - pos0;  // keys of the window inside the split
  if (lim < 64) win &= lim > 0 ? (1ull << lim) - 1 : 0ull;
  return win;
}

// A finished row's normalisation (1 / l) and natural-log lse from its log2-domain max m and sum l.
// A row that saw no key (l == 0) gets 0 and -inf: the combine weighs such a partial as 0.
__device__ __forceinline__ float row_inv(float l) { return l > 0.f ? 1.f / l : 0.f; }
__device__ __forceinline__ float row_lse(float m, float l) { return l > 0.f ? (m + __log2f(l)) * kLn2 : -INFINITY; }
// fp16 partials (the wgmma-ws config, M = 64): row (slot * 64 + r) of the partial region holds 512
// fp16 values, each 256-dim half of the row divided by its own power of two above its largest
// |value| (half_scale); the two scales of a row are floats in the region's second half.
__device__ __forceinline__ __half* half_partials(const Params& p) { return reinterpret_cast<__half*>(p.partial_o); }
__device__ __forceinline__ float* half_partial_scales(const Params& p) {
  return p.partial_o + static_cast<int64_t>(p.max_partials) * 64 * (kVDim / 2);
}
// 2^e with |x| < 2^e for the largest |x| of a half row (1 when it is 0 or not finite); e is kept
// within [-126, 127] so that the scale is a normal float (values then stay below 2 in magnitude).
__device__ __forceinline__ float half_scale(float amax) {
  if (!(amax > 0.f) || !(amax < INFINITY)) return 1.f;
  int e;
  frexpf(amax, &e);
  return ldexpf(1.f, min(max(e, -126), 127));
}

// Writes one thread's share of a finished tile: rows r_lo and r_lo + 8 (accumulator layout),
// dims dim0 + 8j (+1) for j < kTiles. l_lo / l_hi are the rows' full softmax denominators.
template <int kM, int kTiles>
__device__ __forceinline__ void store_rows(const Params& p, const WorkItem& w, const float (&o)[kTiles][4],
                                           float m_lo, float m_hi, float l_lo, float l_hi, int r_lo,
                                           int dim0, bool write_lse) {
  // A row that saw no key in this split (possible for a split of draft tokens only) has l == 0:
  // its partial is 0 with lse -inf, which the combine weighs as 0.
  const float inv_lo = row_inv(l_lo), inv_hi = row_inv(l_hi);
  const float lse_lo = row_lse(m_lo, l_lo), lse_hi = row_lse(m_hi, l_hi);
  const bool ok_lo = r_lo < w.valid_rows, ok_hi = r_lo + 8 < w.valid_rows;
  const int lane = threadIdx.x % 32;
  if (w.num_splits == 1) {
    __nv_bfloat16* out_lo = p.out + (w.q_row_base + r_lo) * kVDim + dim0;
    __nv_bfloat16* out_hi = out_lo + 8 * kVDim;
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      if (ok_lo) *reinterpret_cast<uint32_t*>(out_lo + j * 8) = pack_bf16(o[j][0] * inv_lo, o[j][1] * inv_lo);
      if (ok_hi) *reinterpret_cast<uint32_t*>(out_hi + j * 8) = pack_bf16(o[j][2] * inv_hi, o[j][3] * inv_hi);
    }
    if (write_lse && lane % 4 == 0) {
      if (ok_lo) p.lse[w.q_row_base + r_lo] = lse_lo;
      if (ok_hi) p.lse[w.q_row_base + r_lo + 8] = lse_hi;
    }
  } else {
    const int slot = w.partial_base + w.local;
    float* po_lo = p.partial_o + (static_cast<int64_t>(slot) * kM + r_lo) * kVDim + dim0;
    float* po_hi = po_lo + 8 * kVDim;
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      if (ok_lo) *reinterpret_cast<float2*>(po_lo + j * 8) = make_float2(o[j][0] * inv_lo, o[j][1] * inv_lo);
      if (ok_hi) *reinterpret_cast<float2*>(po_hi + j * 8) = make_float2(o[j][2] * inv_hi, o[j][3] * inv_hi);
    }
    if (write_lse && lane % 4 == 0) {
      if (ok_lo) p.partial_lse[static_cast<int64_t>(slot) * kM + r_lo] = lse_lo;
      if (ok_hi) p.partial_lse[static_cast<int64_t>(slot) * kM + r_lo + 8] = lse_hi;
    }
  }
}

// Programmatic dependent launch (compute capability 9.0+: the launcher sets the attribute on both
// kernels there). The main kernel may launch while the kernel before it finishes: each of its
// threads waits in griddepcontrol.wait before its first global load or store (that kernel may
// write q or the KV cache, or read a buffer the allocator hands this call). It then lets the
// combine launch early (the wgmma-ws kernel's CTA 0 once it has published the plan, every other
// CTA at entry): the combine's blocks wait in griddepcontrol.wait for the whole main grid (its
// partials), but their launch overlaps the main grid's tail. Both are no-ops without the launch
// attribute.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_primary_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// ---------------------------------------------------------------------------------------------
// 2. main
// ---------------------------------------------------------------------------------------------
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) verify_attention_kernel(Params p) {
  constexpr int kM = Cfg::kM, kBN = Cfg::kBlockN, kStages = Cfg::kStages, kThreads = Cfg::kThreads;
  constexpr int kSplit = Cfg::kDimSplit;     // warps a row group
  constexpr int kPartDims = kVDim / kSplit;  // output dims owned by one warp
  constexpr int kOTiles = kPartDims / 8;     // n8 tiles of O per warp

  const int item = blockIdx.x;
  wait_for_primary_grid();  // the kernel before this one in the stream: before any global access
  // The combine may launch once every CTA has allowed it (it waits for this grid before it reads
  // the partials); CTA 0 allows it only after it has published the plan's entries, which the
  // few-row combine reads before its griddepcontrol.wait (as in the wgmma-ws kernel).
  if (item != 0) allow_dependent_launch();
  __shared__ BlockPlan s_plan;
  plan_block<Cfg>(p, item, &s_plan);
  if (item == 0) {
    if (threadIdx.x == 0) __threadfence();  // plan_block's entries (written before its barrier), then:
    __syncthreads();
    allow_dependent_launch();
  }
  if (item >= s_plan.num_items) return;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [kQSmemRows][kSmemRow]
  __nv_bfloat16* sKV = sQ + Cfg::kQSmemRows * kSmemRow;              // [kStages][kBN][kSmemRow]
  float* sEx = reinterpret_cast<float*>(smem_raw + Cfg::kKVBytes);  // [kWarps][kBN / 8][32 lanes][4]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int row_group = warp >> (kSplit / 2), part = warp & (kSplit - 1);  // kSplit: 2 or 4
  const int H = p.num_heads;

  // ---- which work item
  // With 4 warps a row group, in shared memory, read where used (the masked tiles, the store):
  // registers stay free for the loop (`small` runs at the 168 a thread that 384 threads allow).
  // `large` keeps it in registers, ~2 % faster there (kernel/NOTES.md, v26).
  __shared__ WorkItem s_item;
  WorkItem w_local;
  const WorkItem* wp = &w_local;
  if constexpr (Cfg::kSoftmaxShared) {
    if (tid == 0) s_item = decode_item<kM>(p, s_plan, item);
    __syncthreads();
    wp = &s_item;
  } else {
    w_local = decode_item<kM>(p, s_plan, item);
  }
  const WorkItem& w = *wp;
  const int64_t q_row_base = w.q_row_base;
  const int valid_rows = w.valid_rows;
  const int kv_begin = w.kv_begin, kv_end = w.kv_end;

  // ---- Q tile -> shared memory (zero rows past the request's last row), unless it lives in registers
  if constexpr (!Cfg::kQInRegisters) {
    for (int c = tid; c < kM * kChunksPerRow; c += kThreads) {
      const int r = c / kChunksPerRow, k = c % kChunksPerRow;
      const bool ok = r < valid_rows;
      const __nv_bfloat16* src = p.q + (ok ? (q_row_base + r) * kQKDim + k * 8 : 0);
      cp_async_16(sQ + r * kSmemRow + k * 8, src, ok);
    }
    cp_async_commit();
  }

  // KV gather in whole 128-byte lines (kernel/NOTES.md, v27): an octet (8 consecutive threads)
  // copies whole lines of a row, thread u its 16-byte unit u of each, so a warp instruction covers
  // four whole L2 lines. With kBN * 9 lines a tile over kThreads / 8 octets, each octet copies
  // kPer lines: 9 (one row) or 6 (octets < kBN: lines 0-5 of row `octet`; the others lines 6-8
  // of two rows). A tile's slot indices come by cp.async into a two-tile ring in shared memory
  // with the tile before it (the group the loop waits for), so no register carries them.
  constexpr int kLines = kChunksPerRow / 8;
  constexpr int kOctets = kThreads / 8;
  constexpr int kPer = kBN * kLines / kOctets;
  static_assert(kStages == 2, "the slot ring is filled one tile ahead");
  static_assert(kThreads % 8 == 0 && kPer * kOctets == kBN * kLines && (kPer == kLines || kPer == 6),
                "gather layout: an octet copies one row's 9 lines, or 6 and 3 + 3");
  static_assert(kBN <= kThreads, "one thread a row copies the slot indices");
  __shared__ int32_t s_slots[2][kBN];
  const int octet = tid / 8, unit = tid % 8;
  const bool two_rows = kPer != kLines && octet >= kBN;
  const int g_row0 = two_rows ? 2 * (octet - kBN) : octet;
  const int num_tiles = ceil_div(kv_end - kv_begin, kBN);
  const uint64_t kv_policy = l2_evict_first_policy();
  // The tile's slot indices into ring entry `tile % 2` (zero past the split; never used there).
  auto copy_slots = [&](int tile) {
    if (tid < kBN) {
      const int pos = kv_begin + tile * kBN + tid;
      const bool ok = tile < num_tiles && pos < kv_end;
      cp_async_4(&s_slots[tile % 2][tid], p.kv_indices + (ok ? pos : 0), ok);
    }
  };
  // Row r's source (row 0 of the pool, with the copies zero-filled, past the split or outside the
  // pool). Past the split the row is masked: a zero V row times a zero probability cannot turn
  // into NaN. A slot outside the pool (only an unvalidated call can pass one) reads as a row of
  // zeros: a score of 0 that takes its share of the softmax, never a read outside the pool.
  auto row_src = [&](int tile, int r, int slot, bool& ok) {
    ok = kv_begin + tile * kBN + r < kv_end && slot >= 0 && slot < p.num_slots;
    return p.kv + (ok ? static_cast<int64_t>(slot) * kQKDim : 0) + unit * 8;
  };
  auto copy_lines = [&](int tile, int stage, int r, int slot, int line0, int lines) {
    bool ok;
    const __nv_bfloat16* src = row_src(tile, r, slot, ok);
    const uint32_t dst = smem_addr(sKV + (stage * kBN + r) * kSmemRow + unit * 8);
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (i < lines) cp_async_16_evict_first(dst + (line0 + i) * 128, src + (line0 + i) * 64, ok, kv_policy);
  };
  // slot_of(r): row r's slot index. (An octet of two rows reads its second slot after the first
  // row's copies; both read first ran `small` 2-4 % slower on the H200: kernel/NOTES.md, v27.)
  auto load_tile = [&](int tile, int stage, auto slot_of) {
    if (!two_rows) {
      copy_lines(tile, stage, g_row0, slot_of(g_row0), 0, kPer);
    } else {
      copy_lines(tile, stage, g_row0, slot_of(g_row0), kPer, kLines - kPer);
      copy_lines(tile, stage, g_row0 + 1, slot_of(g_row0 + 1), kPer, kLines - kPer);
    }
  };
  // Tile 0 with slots read directly; tile 1's slots into the ring with it.
  if (num_tiles > 0) {
    load_tile(0, 0, [&](int r) {
      const int pos = kv_begin + r;
      return pos < kv_end ? __ldg(p.kv_indices + pos) : -1;
    });
  }
  copy_slots(1);
  cp_async_commit();

  // Rows this thread holds in mma accumulator layout: r_lo = lane/4, r_hi = lane/4 + 8.
  const int r_lo = row_group * 16 + lane / 4;
  // Draft token index of each held row (clamped for padding rows, whose results are dropped).
  const int tok_lo = row_token(w, r_lo, H);
  const int tok_hi = row_token(w, r_lo + 8, H);

  float o[kOTiles][4];
#pragma unroll
  for (int j = 0; j < kOTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;

  const __nv_bfloat16* q_warp = sQ + (row_group * 16) * kSmemRow;
  constexpr int kNT = kBN / 8;
  constexpr int kWarpSteps = kQKDim / 16 / kSplit;  // this warp's k-steps of QK
  constexpr int kSets = Cfg::kQKSets;
  // Q in registers: this warp's k-steps as mma A fragments (rows g and g + 8, dims 2t.. and 2t + 8..
  // of each k16 step; g = lane / 4, t = lane % 4), loaded once; zero past the request's last row.
  uint32_t qf[Cfg::kQInRegisters ? kWarpSteps : 1][4];
  if constexpr (Cfg::kQInRegisters) {
    const int t = lane % 4;
    const bool ok_lo = r_lo < valid_rows, ok_hi = r_lo + 8 < valid_rows;
    const uint32_t* q_lo = reinterpret_cast<const uint32_t*>(p.q + (q_row_base + (ok_lo ? r_lo : 0)) * kQKDim);
    const uint32_t* q_hi = reinterpret_cast<const uint32_t*>(p.q + (q_row_base + (ok_hi ? r_lo + 8 : 0)) * kQKDim);
#pragma unroll
    for (int k = 0; k < kWarpSteps; ++k) {
      const int w0 = ((part * kWarpSteps + k) * 16 + 2 * t) / 2;  // 32-bit word of dims 2t, 2t + 1
      qf[k][0] = ok_lo ? __ldg(q_lo + w0) : 0u;
      qf[k][1] = ok_hi ? __ldg(q_hi + w0) : 0u;
      qf[k][2] = ok_lo ? __ldg(q_lo + w0 + 4) : 0u;
      qf[k][3] = ok_hi ? __ldg(q_hi + w0 + 4) : 0u;
    }
  }

  for (int tile = 0; tile < num_tiles; ++tile) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    {
      // Tile + 1 from the slots that came with this tile; tile + 2's slots into the entry this
      // tile's gather read (every thread read it before the barrier above).
      const int next = tile + 1;
      if (next < num_tiles) load_tile(next, next % 2, [&](int r) { return s_slots[next % 2][r]; });
      copy_slots(next + 1);
      cp_async_commit();
    }
    const __nv_bfloat16* sK = sKV + (tile % kStages) * kBN * kSmemRow;

    // ---- S = Q K^T, all kBN keys of the tile, over this warp's share of the 576 dims (kWarpSteps
    // k-steps): each warp of the row group loads only its share of K (and of Q, unless Q is in
    // registers), and the group adds the partial S tiles through shared memory (kernel/NOTES.md,
    // v23-v24). kNT n8 tiles, each accumulated in kQKSets sets over interleaved k-steps (chains of
    // kWarpSteps / kQKSets dependent mma), added in order.
    float accs[kSets][kNT][4];
#pragma unroll
    for (int x = 0; x < kSets; ++x)
#pragma unroll
      for (int j = 0; j < kNT; ++j) accs[x][j][0] = accs[x][j][1] = accs[x][j][2] = accs[x][j][3] = 0.f;
#pragma unroll(Cfg::kQInRegisters ? kWarpSteps : 2)
    for (int k0 = 0; k0 < kWarpSteps; k0 += kSets) {
#pragma unroll
      for (int x = 0; x < kSets; ++x) {
        const int kk = part * kWarpSteps + k0 + x;
        uint32_t a[4];
        if constexpr (Cfg::kQInRegisters) {
          a[0] = qf[k0 + x][0];
          a[1] = qf[k0 + x][1];
          a[2] = qf[k0 + x][2];
          a[3] = qf[k0 + x][3];
        } else {
          ldmatrix_x4(a, q_warp + (lane % 16) * kSmemRow + kk * 16 + (lane / 16) * 8);
        }
#pragma unroll
        for (int j = 0; j < kNT; j += 2) {
          uint32_t bfrag[4];
          const int key = j * 8 + (lane % 8) + ((lane / 16) * 8);
          const int dim = kk * 16 + ((lane / 8) % 2) * 8;
          ldmatrix_x4(bfrag, sK + key * kSmemRow + dim);
          mma_bf16(accs[x][j], a, bfrag[0], bfrag[1]);
          mma_bf16(accs[x][j + 1], a, bfrag[2], bfrag[3]);
        }
      }
    }
    float acc[kNT][4];
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = accs[0][j][e];
#pragma unroll
        for (int x = 1; x < kSets; ++x) v += accs[x][j][e];
        acc[j][e] = v;
      }
    // The row group's partial tiles have the same accumulator layout: lane l of every warp holds the
    // same (row, key) entries. With two warps a group each adds the other's to its own (IEEE addition
    // makes own + other the same in both), so both hold bitwise the same S; with four, each n8 tile
    // is added by one warp. The slot is rewritten only after the next tile's __syncthreads, by which
    // time the group has read it.
#pragma unroll
    for (int j = 0; j < kNT; ++j)
      *reinterpret_cast<float4*>(sEx + ((warp * kNT + j) * 32 + lane) * 4) =
          make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
    group_barrier<kSplit>(row_group);
    float alpha_lo, alpha_hi;
    bool rescale = true;  // false: every row's alpha is 1 (the threshold's common tile)
    // P stays in registers: the accumulator layout of two n8 tiles is the A operand of one k16 step.
    uint32_t pa[kBN / 16][4];
    if constexpr (Cfg::kSoftmaxShared) {
      // ---- the softmax once a row group (kernel/NOTES.md, v25-v26): this warp adds the partials of
      // its kOwn n8 tiles of S only, in the fixed order ((w0 + w1) + w2) + w3, and computes their
      // scale, mask, row maxima and exponentials; the group trades P as bf16 and, on the tiles where
      // a row max passes its reference by more than the threshold, the maxima too (so all warps hold
      // the same reference and rescale factor). All of it goes through this warp's own partial-S
      // slots of its tiles, which no warp reads as a partial (this warp's own term comes from its
      // registers), each lane its own location: P and the flag in .xy, the maxima in .zw.
      constexpr int kOwn = kNT / kSplit;
      static_assert(kNT % kSplit == 0, "each warp of a row group owns whole n8 tiles of S");
      auto slot = [&](int x, int j) { return sEx + (((row_group * kSplit + x) * kNT + j) * 32 + lane) * 4; };
      float s[kOwn][4];
#pragma unroll
      for (int i = 0; i < kOwn; ++i) {
        // This warp's own term from registers: acc[part * kOwn + i] picked by selects (an index that
        // depends on the warp would put acc in local memory), the other three from shared memory.
        float4 own = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
#pragma unroll
        for (int x = 1; x < kSplit; ++x) {
          const int j = x * kOwn + i;
          if (part == x) own = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
        }
#pragma unroll
        for (int x = 0; x < kSplit; ++x) {
          const float4 v = x == part ? own : *reinterpret_cast<const float4*>(slot(x, part * kOwn + i));
          if (x == 0) {
            s[i][0] = v.x, s[i][1] = v.y, s[i][2] = v.z, s[i][3] = v.w;
          } else {
            s[i][0] += v.x, s[i][1] += v.y, s[i][2] += v.z, s[i][3] += v.w;
          }
        }
      }
      // ---- scale, mask (only tiles that reach the split end or the draft tokens), row maxima
      const int pos0 = kv_begin + tile * kBN;
      const bool needs_mask = tile_needs_mask(w, pos0, kBN);
      float mx_lo = m_lo, mx_hi = m_hi;
#pragma unroll
      for (int i = 0; i < kOwn; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float v = s[i][e] * p.scale_log2;
          const int key = (part * kOwn + i) * 8 + (lane % 4) * 2 + (e & 1);
          if (needs_mask && !key_visible(w, pos0 + key, (e < 2) ? tok_lo : tok_hi)) v = -INFINITY;
          s[i][e] = v;
        }
        mx_lo = fmaxf(mx_lo, fmaxf(s[i][0], s[i][1]));
        mx_hi = fmaxf(mx_hi, fmaxf(s[i][2], s[i][3]));
      }
      quad_max(mx_lo, mx_hi);
      // The reference max moves only when a row max passes it by more than the threshold
      // (advance_max_threshold): P against the current reference, with a flag (did a row of this warp
      // pass?) in the sign bit of its first word (P >= 0, so the bit is free); if no warp of the
      // group raised it, P is final and alpha 1.
      constexpr uint32_t kFlag = 0x80000000u;
      // This warp's P against the references, into .xy of its slots (the first word or'ed with
      // `flag`), and its row sums; then every warp's P of the group into pa (`keep` masks the
      // flag off), returning the or of the first words.
      auto write_p = [&](float ref_lo, float ref_hi, uint32_t flag, float& sum_lo, float& sum_hi) {
        sum_lo = sum_hi = 0.f;
#pragma unroll
        for (int i = 0; i < kOwn; ++i) {
          const uint2 pk = exp_tile(s[i], ref_lo, ref_hi, sum_lo, sum_hi);
          *reinterpret_cast<uint2*>(slot(part, part * kOwn + i)) = make_uint2(pk.x | flag, pk.y);
        }
      };
      auto read_p = [&](uint32_t keep) -> uint32_t {
        uint32_t first = 0u;
#pragma unroll
        for (int x = 0; x < kSplit; ++x)
#pragma unroll
          for (int i = 0; i < kOwn; ++i) {
            const int j = x * kOwn + i;
            const uint2 v = *reinterpret_cast<const uint2*>(slot(x, j));
            first |= v.x;
            pa[j / 2][(j % 2) * 2] = v.x & keep;
            pa[j / 2][(j % 2) * 2 + 1] = v.y;
          }
        return first;
      };
      const bool passed =
          __any_sync(0xffffffffu, mx_lo > m_lo + kRescaleThreshold || mx_hi > m_hi + kRescaleThreshold);
      float sum_lo, sum_hi;
      write_p(row_ref(m_lo), row_ref(m_hi), passed ? kFlag : 0u, sum_lo, sum_hi);
      group_barrier<kSplit>(row_group);
      if (!(read_p(~kFlag) & kFlag)) {
        l_lo += sum_lo;
        l_hi += sum_hi;
        rescale = false;
#ifdef VA_UNIFORM_GROUP_BARRIERS
        // A build for compute-sanitizer's racecheck only (tests/test_kernel_sanitizer.py): as many
        // group barriers a tile as the branch below, so that every row group passes the same number.
        // racecheck reports WAR hazards that the code does not have once the row groups' counts of
        // named barriers drift apart over a long call (kernel/NOTES.md, "racecheck's report against
        // a loop outside the kernel"). The shipped build leaves them out: they cost every tile.
        group_barrier<kSplit>(row_group);
        group_barrier<kSplit>(row_group);
#endif
      } else {
        // The group trades its row maxima (in .zw), moves the reference of the rows that passed,
        // and trades P again (in .xy: every warp read the first P before the maxima's barrier).
        *reinterpret_cast<float2*>(slot(part, part * kOwn) + 2) = make_float2(mx_lo, mx_hi);
        group_barrier<kSplit>(row_group);
#pragma unroll
        for (int x = 0; x < kSplit; ++x) {
          const float2 v = *reinterpret_cast<const float2*>(slot(x, x * kOwn) + 2);
          mx_lo = fmaxf(mx_lo, v.x);
          mx_hi = fmaxf(mx_hi, v.y);
        }
        advance_max_threshold(m_lo, m_hi, mx_lo, mx_hi, alpha_lo, alpha_hi);
        write_p(row_ref(m_lo), row_ref(m_hi), 0u, sum_lo, sum_hi);
        l_lo = l_lo * alpha_lo + sum_lo;
        l_hi = l_hi * alpha_hi + sum_hi;
        group_barrier<kSplit>(row_group);
        read_p(~0u);
      }
    } else {
      // ---- two warps a row group: S = own partial + the other's, the same sum in both warps
      float s[kNT][4];
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        const float4 other = *reinterpret_cast<const float4*>(sEx + (((warp ^ 1) * kNT + j) * 32 + lane) * 4);
        s[j][0] = acc[j][0] + other.x;
        s[j][1] = acc[j][1] + other.y;
        s[j][2] = acc[j][2] + other.z;
        s[j][3] = acc[j][3] + other.w;
      }
      // ---- scale, mask (only tiles that reach the split end or the draft tokens)
      const int pos0 = kv_begin + tile * kBN;
      const bool needs_mask = tile_needs_mask(w, pos0, kBN);
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float v = s[j][e] * p.scale_log2;
          if (needs_mask && !key_visible(w, pos0 + j * 8 + (lane % 4) * 2 + (e & 1), (e < 2) ? tok_lo : tok_hi))
            v = -INFINITY;
          s[j][e] = v;
        }
      }
      // ---- online softmax over the whole tile in every warp of the group (the same values in each)
      float mx_lo = m_lo, mx_hi = m_hi;
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        mx_lo = fmaxf(mx_lo, fmaxf(s[j][0], s[j][1]));
        mx_hi = fmaxf(mx_hi, fmaxf(s[j][2], s[j][3]));
      }
      quad_max(mx_lo, mx_hi);
      float ref_lo, ref_hi;
      advance_max(m_lo, m_hi, mx_lo, mx_hi, ref_lo, ref_hi, alpha_lo, alpha_hi);
      float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        const uint2 pk = exp_tile(s[j], ref_lo, ref_hi, sum_lo, sum_hi);
        pa[j / 2][(j % 2) * 2] = pk.x;
        pa[j / 2][(j % 2) * 2 + 1] = pk.y;
      }
      l_lo = l_lo * alpha_lo + sum_lo;
      l_hi = l_hi * alpha_hi + sum_hi;
    }
    if (rescale)
#pragma unroll
    for (int j = 0; j < kOTiles; ++j) {
      o[j][0] *= alpha_lo;
      o[j][1] *= alpha_lo;
      o[j][2] *= alpha_hi;
      o[j][3] *= alpha_hi;
    }

    // ---- O[:, part] += P V[:, part] over all kBN keys
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
#pragma unroll
      for (int j = 0; j < kOTiles; j += 2) {
        uint32_t bfrag[4];
        const int key = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
        const int dim = part * kPartDims + j * 8 + (lane / 16) * 8;
        ldmatrix_x4_trans(bfrag, sK + key * kSmemRow + dim);
        mma_bf16(o[j], pa[kk], bfrag[0], bfrag[1]);
        mma_bf16(o[j + 1], pa[kk], bfrag[2], bfrag[3]);
      }
    }
  }
  cp_async_wait<0>();

  // ---- finish: row sums across the quad (and, with the softmax shared, across the group), write
  quad_sum(l_lo, l_hi);
  if constexpr (Cfg::kSoftmaxShared) {
    // Each warp summed its own keys: the group's sums added in warp order, through the .xy of each
    // warp's first own slot, once the group has read the last tile's P from there.
    constexpr int kOwn = kNT / kSplit;
    auto slot = [&](int x) { return sEx + (((row_group * kSplit + x) * kNT + x * kOwn) * 32 + lane) * 4; };
    group_barrier<kSplit>(row_group);  // the last tile's P may be read from .xy until here
    *reinterpret_cast<float2*>(slot(part)) = make_float2(l_lo, l_hi);
    group_barrier<kSplit>(row_group);
    l_lo = l_hi = 0.f;
#pragma unroll
    for (int x = 0; x < kSplit; ++x) {
      const float2 v = *reinterpret_cast<const float2*>(slot(x));
      l_lo += v.x;
      l_hi += v.y;
    }
  }
  store_rows<kM>(p, w, o, m_lo, m_hi, l_lo, l_hi, r_lo, part * kPartDims + (lane % 4) * 2, part == 0);
}

// ---------------------------------------------------------------------------------------------
// 3. combine: one block per (token, head) row of a split request. kGroups groups of 128 threads;
//    a thread holds 4 of the 512 dims, its group every kGroups-th split. The groups' sums are
//    added in group order: a fixed order, so the output is bitwise deterministic. The launcher
//    uses 4 groups when there are few rows (so many splits per row, whose 2 KB partials would
//    otherwise be read one after another) and 1 when there are many rows (few splits each).
// ---------------------------------------------------------------------------------------------
constexpr int kCombineLanes = kVDim / 4;  // threads per group

// A combine block's output row within the partial layout: its request, the request's row tiles,
// and the row's tile and place in it. Read from the call's inputs only, so before the wait.
struct CombineRow {
  int b, row_tiles, row_tile, in_tile;
  bool in_batch;  // false for q rows past qo_indptr[B] (outside the contract; never written)
  // Row of split s's partial (the request's partials start at slot base, split-major).
  template <int kM>
  __device__ __forceinline__ int64_t partial_row(int base, int s) const {
    return static_cast<int64_t>(base + s * row_tiles + row_tile) * kM + in_tile;
  }
};
template <int kM>
__device__ __forceinline__ CombineRow combine_row(const Params& p, int row) {
  const int H = p.num_heads;
  const int b = min(upper_index(p.qo_indptr, p.batch + 1, row / H), p.batch - 1);
  const int q0 = __ldg(p.qo_indptr + b), q1 = __ldg(p.qo_indptr + b + 1);
  const int r = row - q0 * H;
  return {b, ceil_div((q1 - q0) * H, kM), r / kM, r % kM, r < (q1 - q0) * H};
}

template <class Cfg, int kGroups, bool kHalf = false>
__global__ void __launch_bounds__(kGroups * kCombineLanes) combine_kernel(Params p, int total_rows) {
  const int row = blockIdx.x;  // flattened (token, head)
  if (row >= total_rows) return;
  const CombineRow cr = combine_row<Cfg::kM>(p, row);
  wait_for_primary_grid();  // before reading the main kernel's plan or partials
  if (!cr.in_batch) return;
  const int splits = p.num_splits[cr.b];
  if (splits == 1) return;  // written directly by the main kernel
  const int base = p.partial_base[cr.b];
  const int t = threadIdx.x % kCombineLanes, g = threadIdx.x / kCombineLanes;
  auto partial_row = [&](int s) { return cr.partial_row<Cfg::kM>(base, s); };

  // The largest partial lse: all groups' threads read the splits' values once, then a block max.
  constexpr int kThreads = kGroups * kCombineLanes;
  __shared__ float s_max[kThreads / 32];
  float mx = -INFINITY;
  for (int s = threadIdx.x; s < splits; s += kThreads) mx = fmaxf(mx, p.partial_lse[partial_row(s)]);
  mx = block_max<kThreads>(mx, s_max);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float denom = 0.f;
#pragma unroll 4
  for (int s = g; s < splits; s += kGroups) {
    const int64_t prow = partial_row(s);
    const float w = __expf(p.partial_lse[prow] - mx);
    denom += w;
    float4 v;
    float wv = w;
    if constexpr (kHalf) {
      const uint2 raw = reinterpret_cast<const uint2*>(half_partials(p) + prow * kVDim)[t];
      const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
      const float2 b2 = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
      v = make_float4(a.x, a.y, b2.x, b2.y);
      wv = w * half_partial_scales(p)[prow * 2 + t / (kCombineLanes / 2)];
    } else {
      v = reinterpret_cast<const float4*>(p.partial_o + prow * kVDim)[t];
    }
    acc.x += wv * v.x;
    acc.y += wv * v.y;
    acc.z += wv * v.z;
    acc.w += wv * v.w;
  }
  if constexpr (kGroups > 1) {
    __shared__ float4 s_acc[kGroups][kCombineLanes];
    __shared__ float s_denom[kGroups];
    if (g != 0) {
      s_acc[g][t] = acc;
      if (t == 0) s_denom[g] = denom;
    }
    __syncthreads();
    if (g != 0) return;
#pragma unroll
    for (int k = 1; k < kGroups; ++k) {
      const float4 v = s_acc[k][t];
      acc.x += v.x;
      acc.y += v.y;
      acc.z += v.z;
      acc.w += v.w;
      denom += s_denom[k];
    }
  }
  const float inv = 1.f / denom;
  uint2 packed;
  packed.x = pack_bf16(acc.x * inv, acc.y * inv);
  packed.y = pack_bf16(acc.z * inv, acc.w * inv);
  reinterpret_cast<uint2*>(p.out + static_cast<int64_t>(row) * kVDim)[t] = packed;
  if (t == 0) p.lse[row] = mx + __logf(denom);
}


// The combine for calls with few rows, i.e. many splits a row. One block per row; a group of 64
// threads reads a split's row, each thread its 8 dims: with one 16-byte load of fp16 partials (the
// wgmma-ws kernels', kHalf, 1 KB a row) or two of fp32 partials (the mma.sync kernels', 2 KB a
// row, no scales); each thread loads the lse, scale and values of up to kPer splits before it uses
// any of them, so that a row's partials (66 KB at 128 rows in fp16) are in flight at once. Profiled before
// (Nsight Compute, P=32k H=8 T=16): the two-pass combine above ran 6.2 us at 20 % of L2
// throughput, 25 % of warp slots, stalled on loads (long scoreboard) 44 % of the time: latency,
// with ~16 KB in flight an SM. Each thread keeps a running max of the lse it has seen (its sums
// rescaled when it grows); the groups are merged in group order, so the result is deterministic.
constexpr int kWideLanes = kVDim / 8;  // threads per group: 8 dims (16 bytes of fp16) each

template <class Cfg, int kGroups, int kPer, bool kHalf>
__global__ void __launch_bounds__(kGroups * kWideLanes) combine_wide_kernel(Params p, int total_rows) {
  const int row = blockIdx.x;  // flattened (token, head)
  if (row >= total_rows) return;
  const CombineRow cr = combine_row<Cfg::kM>(p, row);
  const int t = threadIdx.x % kWideLanes, g = threadIdx.x / kWideLanes;
#ifdef VA_PLAN_BEFORE_WAIT
  // v77's order (kernel/NOTES.md v78): the plan's entries before the wait, one L2 round trip off
  // the path after the main grid. Every main kernel's CTA 0 writes them and fences before it lets
  // this kernel launch, but the launch does not make them visible here: only the wait does.
  const int splits = __ldcg(p.num_splits + cr.b), base = __ldcg(p.partial_base + cr.b);
  wait_for_primary_grid();
#else
  // The plan's entries are the main kernel's output: read after the wait, which alone makes the
  // main grid's writes visible to this one (launching it early does not). From L2
  // (`ld.global.cg`): an earlier call's values may still sit in this SM's L1.
  wait_for_primary_grid();  // before reading the plan and the partials (and, every block, before it ends)
  const int splits = __ldcg(p.num_splits + cr.b), base = __ldcg(p.partial_base + cr.b);
#endif
  if (splits == 1 || !cr.in_batch) return;  // written directly by the main kernel / no request's row
  [[maybe_unused]] const __half* parts = half_partials(p);
  [[maybe_unused]] const float* scales = half_partial_scales(p);
  float m = -INFINITY, denom = 0.f, acc[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) acc[e] = 0.f;
  constexpr int kWords = kHalf ? 1 : 2;  // 16-byte words of a thread's 8 dims
  for (int s0 = g; s0 < splits; s0 += kGroups * kPer) {
    uint4 v[kPer][kWords];
    float lse[kPer], sc[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int s = s0 + i * kGroups;
#ifdef VA_MUTATE_COMBINE_EXTRA_SPLIT
      if (s <= splits) {  // for tests only: one slot past the request's splits, which no item wrote
#else
      if (s < splits) {
#endif
        const int64_t prow = cr.partial_row<Cfg::kM>(base, s);
        lse[i] = p.partial_lse[prow];
        if constexpr (kHalf) {
          sc[i] = scales[prow * 2 + t / (kWideLanes / 2)];
          v[i][0] = reinterpret_cast<const uint4*>(parts + prow * kVDim)[t];
        } else {
          sc[i] = 1.f;
#pragma unroll
          for (int k = 0; k < kWords; ++k)
            v[i][k] = reinterpret_cast<const uint4*>(p.partial_o + prow * kVDim)[2 * t + k];
        }
      } else {
        lse[i] = -INFINITY;
        sc[i] = 0.f;
#pragma unroll
        for (int k = 0; k < kWords; ++k) v[i][k] = make_uint4(0, 0, 0, 0);
      }
    }
    float bm = m;
#pragma unroll
    for (int i = 0; i < kPer; ++i) bm = fmaxf(bm, lse[i]);
    if (bm > m) {  // the running max grows: rescale what is summed so far (nothing when m is -inf)
      const float f = m > -INFINITY ? __expf(m - bm) : 0.f;
      denom *= f;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] *= f;
      m = bm;
    }
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const float w = lse[i] > -INFINITY ? __expf(lse[i] - m) : 0.f;  // a split with no visible key: 0
      denom += w;
      const float wv = w * sc[i];
      if constexpr (kHalf) {
        const uint32_t words[4] = {v[i][0].x, v[i][0].y, v[i][0].z, v[i][0].w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float2 f2 = __half22float2(*reinterpret_cast<const __half2*>(&words[k]));
          acc[2 * k] += wv * f2.x;
          acc[2 * k + 1] += wv * f2.y;
        }
      } else {
#pragma unroll
        for (int k = 0; k < kWords; ++k) {
          acc[4 * k] += wv * __uint_as_float(v[i][k].x);
          acc[4 * k + 1] += wv * __uint_as_float(v[i][k].y);
          acc[4 * k + 2] += wv * __uint_as_float(v[i][k].z);
          acc[4 * k + 3] += wv * __uint_as_float(v[i][k].w);
        }
      }
    }
  }
  // Merge the groups in group order (deterministic): group 0 rescales each to the largest max.
  __shared__ float s_m[kGroups], s_d[kGroups];
  __shared__ float4 s_acc[kGroups][2][kWideLanes];
  if (t == 0) {
    s_m[g] = m;
    s_d[g] = denom;
  }
  s_acc[g][0][t] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  s_acc[g][1][t] = make_float4(acc[4], acc[5], acc[6], acc[7]);
  __syncthreads();
  if (g != 0) return;
  float mx = s_m[0];
#pragma unroll
  for (int k = 1; k < kGroups; ++k) mx = fmaxf(mx, s_m[k]);
  float out[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, d = 0.f;
#pragma unroll
  for (int k = 0; k < kGroups; ++k) {
    const float f = s_m[k] > -INFINITY ? __expf(s_m[k] - mx) : 0.f;
    d += f * s_d[k];
    const float4 a = s_acc[k][0][t], c = s_acc[k][1][t];
    out[0] += f * a.x; out[1] += f * a.y; out[2] += f * a.z; out[3] += f * a.w;
    out[4] += f * c.x; out[5] += f * c.y; out[6] += f * c.z; out[7] += f * c.w;
  }
  const float inv = 1.f / d;
  uint4 packed;
  packed.x = pack_bf16(out[0] * inv, out[1] * inv);
  packed.y = pack_bf16(out[2] * inv, out[3] * inv);
  packed.z = pack_bf16(out[4] * inv, out[5] * inv);
  packed.w = pack_bf16(out[6] * inv, out[7] * inv);
  reinterpret_cast<uint4*>(p.out + static_cast<int64_t>(row) * kVDim)[t] = packed;
  if (t == 0) p.lse[row] = mx + __logf(d);
}

}  // namespace va
