// Launchers for the verify-attention kernels (torch-free).
#include <cuda.h>  // CUtensorMap and its encoder's types (the encoder is looked up through the runtime)

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "verify_attention.cuh"
#include "verify_attention_sm90.cuh"
#include "verify_attention.h"

#include <type_traits>

namespace va {
namespace {

// Up to this many output rows, the combine gives each row 4 thread groups (kernel/NOTES.md, v6):
// ~132 x 64 / rows splits per row, 16+ here.
constexpr int kCombineManySplitsRows = 512;

size_t align256(size_t x) { return (x + 255) / 256 * 256; }

template <class Cfg>
size_t workspace_bytes(int batch, int max_partials) {
  size_t ints = 2 + (batch + 1) + 2 * static_cast<size_t>(batch);
  return align256(ints * 4) + align256(static_cast<size_t>(max_partials) * Cfg::kM * 4) +
         static_cast<size_t>(max_partials) * Cfg::kM * kVDim * 4;
}

template <class Cfg>
void fill_plan(int batch, int num_tokens, int num_heads, int max_partials, int config, Plan* plan) {
  // Splits are whole tiles, so every split and tile starts a multiple of 16 keys into its request:
  // tests/test_split_boundaries.py plants its needles on both sides of each such position.
  static_assert(Cfg::kBlockN % 16 == 0, "KV tiles of a multiple of 16 keys");
  plan->config = config;
  plan->rows_per_cta = Cfg::kM;
  plan->block_n = Cfg::kBlockN;
  plan->stages = Cfg::kStages;
  plan->threads = Cfg::kThreads;
  plan->smem_bytes = Cfg::kSmemBytes;
  plan->max_partials = max_partials;
  // Unsplit work: sum_b ceil(T_b H / M) <= N H / M + B.
  const long long unsplit = static_cast<long long>(num_tokens) * num_heads / Cfg::kM + batch;
  plan->max_items = static_cast<int>(unsplit > max_partials ? unsplit : max_partials);
  plan->workspace_bytes = workspace_bytes<Cfg>(batch, max_partials);
}

// combine_wide_kernel with kGroups groups of kWideLanes threads a row; each thread loads 9 splits
// before it uses any (kGroups x 9 splits a batch). kHalf: fp16 partials (the wgmma-ws configs').
template <class Cfg, int kGroups, bool kHalf>
cudaError_t launch_combine_wide(cudaLaunchConfig_t lc, const Params& p, int rows) {
  lc.blockDim = dim3(kGroups * kWideLanes);
  return cudaLaunchKernelEx(&lc, combine_wide_kernel<Cfg, kGroups, 9, kHalf>, p, rows);
}

using MainKernel = void (*)(Params);

// The driver's tensor-map encoder, looked up once through the runtime, so that the build links no
// libcuda of its own; null where the driver has none (then no kernel gets a map).
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiled tensor_map_encoder() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();  // not sticky; cleared so that it is not reported by a later call
      return static_cast<EncodeTiled>(nullptr);
    }
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

// q ([rows][576] bf16, 16-byte aligned: the binding checks it) as 64-row x 64-dim boxes with the
// 128-byte swizzle, so that box (c, row tile) lands as chunk c of the row tile in the kernels'
// swizzled layout; rows past the end come in as zeros. False where no map can be made.
bool encode_q_map(const void* q, int rows, uint64_t (&map)[16]) {
#ifdef VA_Q_CP_ASYNC
  return false;  // v62's cp.async copies of Q, for an A/B (kernel/NOTES.md, v67)
#endif
  // The path of a driver without the encoder, on demand: the tests run it on every GPU.
  if (std::getenv("VERIFY_ATTN_NO_Q_TENSOR_MAP") != nullptr) return false;
  // The last map this thread encoded, reused while q's buffer and row count repeat (a decode loop
  // over layers, a benchmark): one encode less of host time a call (no GPU time either way,
  // kernel/NOTES.md v67b).
  struct Last {
    const void* q = nullptr;
    int rows = 0;
    uint64_t map[16];
  };
  thread_local Last last;
  if (last.q != nullptr && last.q == q && last.rows == rows) {
    std::memcpy(map, last.map, sizeof map);
    return true;
  }
  const EncodeTiled encode = tensor_map_encoder();
  if (encode == nullptr || rows <= 0) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kQKDim), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(kQKDim) * 2};  // bytes between rows
  const cuuint32_t box[2] = {64, 64}, element_strides[2] = {1, 1};
  CUtensorMap m;
  static_assert(sizeof(m) == sizeof(map), "a CUtensorMap is 128 bytes");
  if (encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(q), dims, strides, box, element_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    return false;
  std::memcpy(map, &m, sizeof m);
  last.q = q;
  last.rows = rows;
  std::memcpy(last.map, &m, sizeof m);
  return true;
}

template <class Cfg>
cudaError_t launch_impl(const Args& a, const Plan& plan, cudaStream_t stream, MainKernel main_kernel) {
  Params p{};
  p.q = static_cast<const __nv_bfloat16*>(a.q);
  p.kv = static_cast<const __nv_bfloat16*>(a.kv);
  p.kv_indices = a.kv_indices;
  p.qo_indptr = a.qo_indptr;
  p.kv_indptr = a.kv_indptr;
  p.tree_mask = a.tree_mask;
  p.tree_mask_indptr = a.tree_mask_indptr;
  p.out = static_cast<__nv_bfloat16*>(a.out);
  p.lse = a.lse;
  char* ws = static_cast<char*>(a.workspace);
  int32_t* ints = reinterpret_cast<int32_t*>(ws);
  p.plan = ints;
  p.item_prefix = ints + 2;
  p.partial_base = p.item_prefix + a.batch + 1;
  p.num_splits = p.partial_base + a.batch;
  const size_t ints_bytes = align256((2 + (a.batch + 1) + 2 * static_cast<size_t>(a.batch)) * 4);
  p.partial_lse = reinterpret_cast<float*>(ws + ints_bytes);
  p.partial_o = reinterpret_cast<float*>(ws + ints_bytes +
                                         align256(static_cast<size_t>(plan.max_partials) * Cfg::kM * 4));
  p.batch = a.batch;
  p.num_heads = a.num_heads;
  p.num_slots = a.num_slots;
  p.num_q_rows = a.num_tokens * a.num_heads;
  p.num_kv_indices = a.num_kv_indices;
  p.scale_log2 = a.sm_scale * 1.4426950408889634f;
  p.max_items = plan.max_items;
  p.max_partials = plan.max_partials;
  p.min_split_tiles = (Cfg::kMinSplitKeys + Cfg::kBlockN - 1) / Cfg::kBlockN;
  if constexpr (kIsWgmmaWs<Cfg>) {
    if (kQStagedAtEntry<Cfg>) p.q_tma = encode_q_map(a.q, p.num_q_rows, p.q_map) ? 1 : 0;
  }

  // Raising the dynamic shared-memory limit is not a stream operation, so it is legal during
  // graph capture. It is a per-device setting: done once per process, config and device.
  // (A function-local static per instantiation: one bitmask per config.)
  static std::atomic<uint64_t> smem_set_on{0};  // bit d: set on device d (devices 0..63)
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (bit == 0 || !(smem_set_on.load(std::memory_order_relaxed) & bit)) {
    e = cudaFuncSetAttribute(main_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             Cfg::kSmemBytes);
    if (e != cudaSuccess) return e;
    smem_set_on.fetch_or(bit, std::memory_order_relaxed);
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  // Compute capability 9.0 and newer (sm_90 and sm_120; griddepcontrol): both kernels launch as
  // programmatic dependents. The main grid may launch while the kernel before it in the stream
  // finishes (its CTAs wait in griddepcontrol.wait before they touch global memory), and every
  // main kernel triggers the combine's launch early. Older devices launch each after the last.
  cudaLaunchConfig_t mc = {};
  mc.gridDim = dim3(plan.max_items);
  mc.blockDim = dim3(Cfg::kThreads);
  mc.dynamicSmemBytes = Cfg::kSmemBytes;
  mc.stream = stream;
  mc.attrs = attr;
  mc.numAttrs = plan.dependent_combine ? 1 : 0;
  e = cudaLaunchKernelEx(&mc, main_kernel, p);
  if (e != cudaSuccess) return e;
  const int rows = p.num_q_rows;
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(rows);
  lc.stream = stream;
  lc.attrs = attr;
  lc.numAttrs = plan.dependent_combine ? 1 : 0;
  // Few rows means many splits per row (the plan fills the GPU): 4 groups read a row's splits
  // in parallel. Many rows (few splits each) already fill the GPU with one group per row.
  constexpr bool kHalf = kIsWgmmaWs<Cfg>;  // its partials are fp16 (half_partials)
#ifndef VA_COMBINE_TWO_PASS
  // Few rows: one block a row with every split's partial in flight at once (combine_wide_kernel);
  // the groups a block shrink as rows grow so that the blocks stay one wave (splits a row shrink
  // too). Every config: fp16 partials (wgmma-ws) or fp32 (mma.sync, kernel/NOTES.md v59).
  if (rows <= 132) return launch_combine_wide<Cfg, 8, kHalf>(lc, p, rows);
  if (rows <= 264) return launch_combine_wide<Cfg, 4, kHalf>(lc, p, rows);
  if (rows <= kCombineManySplitsRows) return launch_combine_wide<Cfg, 2, kHalf>(lc, p, rows);
#endif
  if (rows <= kCombineManySplitsRows) {
    lc.blockDim = dim3(4 * kCombineLanes);
    return cudaLaunchKernelEx(&lc, combine_kernel<Cfg, 4, kHalf>, p, rows);
  }
  lc.blockDim = dim3(kCombineLanes);
  return cudaLaunchKernelEx(&lc, combine_kernel<Cfg, 1, kHalf>, p, rows);
}

// The one map from a config id to its tile config and main kernel: the shared-memory size, the
// plan and the launch all dispatch through it. f(ConfigTag<Cfg>{}, kernel); false for an id that
// names no config (kConfigAuto included: make_plan resolves it first).
template <class Cfg>
struct ConfigTag {
  using type = Cfg;
};

// Whether the code this device runs for `kernel` (and the combine, built alike) was compiled for
// compute capability 9.0 or newer: `griddepcontrol` exists only there (verify_attention.cuh
// compiles it out below). A build JIT-compiled on the device from older PTX (an 8.0+PTX build on
// an H100) must not launch as programmatic dependents: the combine would not wait for the
// partials. Asked once per config and device (devices 0..63; others ask every call).
template <class Cfg>
cudaError_t compiled_with_griddepcontrol(MainKernel kernel, int device, bool* yes) {
  static std::atomic<uint64_t> known{0}, with{0};
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (bit != 0 && (known.load(std::memory_order_relaxed) & bit)) {
    *yes = (with.load(std::memory_order_relaxed) & bit) != 0;
    return cudaSuccess;
  }
  cudaFuncAttributes fa = {};
  const cudaError_t e = cudaFuncGetAttributes(&fa, kernel);
  if (e != cudaSuccess) return e;
  *yes = fa.ptxVersion >= 90;
  if (bit != 0) {
    if (*yes) with.fetch_or(bit, std::memory_order_relaxed);
    known.fetch_or(bit, std::memory_order_relaxed);
  }
  return cudaSuccess;
}

template <class F>
bool with_config(int config, F&& f) {
  switch (config) {
    case kConfigLarge: f(ConfigTag<ConfigLarge>{}, verify_attention_kernel<ConfigLarge>); return true;
    case kConfigSmall: f(ConfigTag<ConfigSmall>{}, verify_attention_kernel<ConfigSmall>); return true;
    case kConfigSmallM32: f(ConfigTag<ConfigSmallM32>{}, verify_attention_kernel<ConfigSmallM32>); return true;
    case kConfigWgmma: f(ConfigTag<ConfigWgmma>{}, verify_attention_wgmma_kernel<ConfigWgmma>); return true;
    case kConfigWgmmaWs: f(ConfigTag<ConfigWgmmaWs>{}, verify_attention_wgmma_ws_kernel<ConfigWgmmaWs>); return true;
    case kConfigWgmmaWsPipe:
      f(ConfigTag<ConfigWgmmaWsPipe>{}, verify_attention_wgmma_ws_kernel<ConfigWgmmaWsPipe>);
      return true;
    default: return false;
  }
}

}  // namespace

bool wgmma_built() {
#ifdef VA_HAVE_SM90A
  return true;
#else
  return false;
#endif
}

cudaError_t make_plan(int device, int batch, int num_tokens, int num_heads, int num_kv_indices, int config,
                      int max_partials, Plan* plan) {
  int smem_optin = 0, sms = 0, major = 0, minor = 0;
  cudaError_t e = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (e != cudaSuccess) return e;
  e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return e;
  // A call laid out for another SM count (a box with more or fewer SMs than this device) is laid
  // out for it throughout: the shape rule below and the split plan alike.
  if (max_partials > 0) sms = max_partials;
  e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (e != cudaSuccess) return e;
  e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (e != cudaSuccess) return e;
  // wgmma needs an sm_90a build running on a compute capability 9.0 device.
  const bool wgmma_ok = wgmma_built() && major == 9 && minor == 0;
  if (config == kConfigAuto) {
    config = wgmma_ok && smem_optin >= ConfigWgmmaWsPipe::kSmemBytes &&
                     wgmma_ws_pipelined(static_cast<long long>(num_tokens) * num_heads, batch)
                 ? kConfigWgmmaWsPipe
             : wgmma_ok && smem_optin >= ConfigWgmmaWs::kSmemBytes ? kConfigWgmmaWs
             : smem_optin >= ConfigLarge::kSmemBytes               ? kConfigLarge
             : prefer_small_m32(static_cast<long long>(num_tokens) * num_heads, num_kv_indices, sms)
                 ? kConfigSmallM32
                 : kConfigSmall;
  }
  if ((config == kConfigWgmma || config == kConfigWgmmaWs || config == kConfigWgmmaWsPipe) && !wgmma_ok)
    return cudaErrorNotSupported;
  // One CTA per SM fits (shared memory bound), so about one wave of work items.
  if (max_partials <= 0) max_partials = sms;
  if (!with_config(config, [&](auto cfg, MainKernel) {
        fill_plan<typename decltype(cfg)::type>(batch, num_tokens, num_heads, max_partials, config, plan);
      }))
    return cudaErrorInvalidValue;
  // The plan names the config and its size even when the device cannot hold it (the caller's error).
  if (smem_optin < plan->smem_bytes) return cudaErrorInvalidValue;
  bool griddepcontrol = false;
  with_config(config, [&](auto cfg, MainKernel kernel) {
    e = compiled_with_griddepcontrol<typename decltype(cfg)::type>(kernel, device, &griddepcontrol);
  });
  if (e != cudaSuccess) return e;
  plan->dependent_combine = major >= 9 && griddepcontrol ? 1 : 0;
  return cudaSuccess;
}

cudaError_t launch(const Args& args, const Plan& plan, cudaStream_t stream) {
  cudaError_t e = cudaErrorInvalidValue;
  with_config(plan.config, [&](auto cfg, MainKernel kernel) {
    e = launch_impl<typename decltype(cfg)::type>(args, plan, stream, kernel);
  });
  return e;
}

const char* build_info() {
#define VA_STR2(x) #x
#define VA_STR(x) VA_STR2(x)
  return "wgmma-ws (sm_90a): M=64 BN=" VA_STR(VA_WS_BLOCK_N) " stages=" VA_STR(VA_WS_STAGES)
         " (3 warpgroups: S + 2 x PV; wgmma-ws-pipe from 256 rows a request: QK of the next tile"
         " during the softmax), KV gathers L2 evict_first; wgmma (sm_90a): M=64 BN=64 stages=2 "
         "(2 warpgroups)"
#ifndef VA_HAVE_SM90A
         " [not in this build]"
#endif
         "; mma.sync m16n8k16 bf16: large M=64 BN=32 stages=2 (8 warps, 2 a row group), small M=48 "
         "BN=32 stages=2 (12 warps, 4 a row group: Q in registers, one softmax a group), small-m32 M=32 "
         "BN=32 stages=2 (8 warps, 4 a row group: Q in registers, one softmax a group)"
#if VA_SMALL_SHAPE == 48
         " [auto: always small, VA_SMALL_SHAPE=48]"
#elif VA_SMALL_SHAPE == 32
         " [auto: always small-m32, VA_SMALL_SHAPE=32]"
#endif
         "; nvcc " VA_STR(__CUDACC_VER_MAJOR__) "." VA_STR(__CUDACC_VER_MINOR__);
}

}  // namespace va
