// Host-side interface of the verify-attention kernels (plain C++; shared by the torch binding
// and any standalone build). Pointers are device pointers; shapes as in kernel/__init__.py.
#pragma once

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

namespace va {

struct Args {
  const void* q;                   // [N, H, 576] bf16
  const void* kv;                  // [S, 576] bf16
  const int32_t* kv_indices;       // [K]
  const int32_t* qo_indptr;        // [B+1]
  const int32_t* kv_indptr;        // [B+1]
  const int32_t* tree_mask;        // packed visibility words
  const int32_t* tree_mask_indptr; // [B+1]
  void* out;                       // [N, H, 512] bf16
  float* lse;                      // [N, H]
  void* workspace;                 // Plan::workspace_bytes, 256-byte aligned
  int batch;
  int num_tokens;
  int num_heads;
  int num_slots;
  int num_kv_indices;              // K
  float sm_scale;
};

enum ConfigId {
  kConfigAuto = 0,
  kConfigLarge = 1,
  kConfigSmall = 2,
  kConfigWgmma = 3,
  kConfigWgmmaWs = 4,
  kConfigSmallM32 = 5,
  kConfigWgmmaWsPipe = 6,
};

// Everything the launch needs that depends only on shapes and the device (never on data), so
// the workspace can be allocated up front and the call captured in a CUDA graph.
struct Plan {
  int config;            // a ConfigId other than kConfigAuto
  int rows_per_cta;      // M
  int block_n;           // keys per KV tile
  int stages;
  int threads;
  int smem_bytes;
  int max_items;         // grid of the main kernel
  int max_partials;      // split work items at most (about one CTA per SM)
  int dependent_combine; // 1: the combine is a programmatic dependent launch (compute capability >= 9.0)
  size_t workspace_bytes;
};

// Returns cudaErrorInvalidValue when the device cannot hold the requested configuration (plan->config
// and plan->smem_bytes then name the config, kConfigAuto resolved, and what it needs) or the id names
// no config, and cudaErrorNotSupported for the wgmma configs without an sm_90a build or on a device
// other than cc 9.0. kConfigAuto picks wgmma-ws where it can run (wgmma-ws-pipe from 256 rows a
// request: wgmma_ws_pipelined in verify_attention_sm90.cuh), else large where it fits, else
// per call small-m32 or small (prefer_small_m32 in verify_attention.cuh: rows, KV indices and the
// SM count). num_kv_indices: K, the call's KV index count. max_partials: the SM count the call is
// laid out for (the split plan and the shape rule), <= 0 for the device's own. `device` must be the
// current device (the plan asks the driver what code its kernels run there).
cudaError_t make_plan(int device, int batch, int num_tokens, int num_heads, int num_kv_indices, int config,
                      int max_partials, Plan* plan);
cudaError_t launch(const Args& args, const Plan& plan, cudaStream_t stream);
bool wgmma_built();  // the build includes sm_90a code (the wgmma kernels)
const char* build_info();

}  // namespace va
