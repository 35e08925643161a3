// Drives the wgmma tile steps of the sm_90a kernel (kernel/csrc/verify_attention_sm90.cuh) on
// one 64-row tile, so tests/test_wgmma_probe.py can check each against a torch matmul:
//   S = Q K^T       (qk_tile: both warpgroups, 32 keys each)      -> s_out [64, 64] fp32
//   O = P V         (store_p_pair + pv_tile, V = K[:, :512])       -> o_out [64, 512] fp32
// Built as its own small extension for sm_90a by the test; not part of the package.
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <torch/extension.h>

#include "verify_attention_sm90.cuh"

namespace {

__global__ void __launch_bounds__(256, 1)
    probe_kernel(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* p_in, float* s_out,
                 float* o_out) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Cfg = va::ConfigWgmma;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t raw = va::smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint32_t sQ = base + Cfg::kQOff, sK = base + Cfg::kKVOff, sP = base + Cfg::kPOff;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wg = warp / 4;
  const int r_lo = (warp % 4) * 16 + lane / 4;

  va::copy_row_swizzled(sQ, tid / 4, tid % 4, q + (tid / 4) * va::kQKDim, true);
  va::copy_row_swizzled(sK, tid / 4, tid % 4, k + (tid / 4) * va::kQKDim, true);
  va::cp_async_commit();
  va::cp_async_wait<0>();
  va::fence_proxy_async();
  __syncthreads();

  float s[4][4];
  va::qk_tile(s, sQ, sK, wg);
  for (int j = 0; j < 4; ++j)
    for (int e = 0; e < 4; ++e) {
      const int r = r_lo + (e >= 2 ? 8 : 0), c = wg * 32 + j * 8 + (lane % 4) * 2 + (e & 1);
      s_out[r * 64 + c] = s[j][e];
    }

  // P written by each thread at its accumulator positions, as the kernel does.
  for (int j = 0; j < 4; ++j)
    for (int h = 0; h < 2; ++h) {
      const int r = r_lo + 8 * h, c = wg * 32 + j * 8 + (lane % 4) * 2;
      const uint32_t packed = *reinterpret_cast<const uint32_t*>(p_in + r * 64 + c);
      va::store_p_pair(sP, r, c, packed);
    }
  va::fence_proxy_async();
  __syncthreads();

  float o[32][4];
  for (int j = 0; j < 32; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  va::pv_tile(o, sP, sK, wg);
  for (int j = 0; j < 32; ++j)
    for (int e = 0; e < 4; ++e) {
      const int r = r_lo + (e >= 2 ? 8 : 0), c = wg * 256 + j * 8 + (lane % 4) * 2 + (e & 1);
      o_out[r * 512 + c] = o[j][e];
    }
#endif
}

std::vector<at::Tensor> probe(const at::Tensor& q, const at::Tensor& k, const at::Tensor& p) {
  TORCH_CHECK(q.is_cuda() && q.dtype() == at::kBFloat16 && q.is_contiguous() && q.sizes() == at::IntArrayRef({64, 576}),
              "q must be a contiguous CUDA bf16 [64, 576]");
  TORCH_CHECK(k.is_cuda() && k.dtype() == at::kBFloat16 && k.is_contiguous() && k.sizes() == at::IntArrayRef({64, 576}),
              "k must be a contiguous CUDA bf16 [64, 576]");
  TORCH_CHECK(p.is_cuda() && p.dtype() == at::kBFloat16 && p.is_contiguous() && p.sizes() == at::IntArrayRef({64, 64}),
              "p must be a contiguous CUDA bf16 [64, 64]");
  auto s_out = at::zeros({64, 64}, q.options().dtype(at::kFloat));
  auto o_out = at::zeros({64, 512}, q.options().dtype(at::kFloat));
  const int smem = va::ConfigWgmma::kSmemBytes;
  C10_CUDA_CHECK(cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  probe_kernel<<<1, 256, smem, c10::cuda::getCurrentCUDAStream()>>>(
      static_cast<const __nv_bfloat16*>(q.data_ptr()), static_cast<const __nv_bfloat16*>(k.data_ptr()),
      static_cast<const __nv_bfloat16*>(p.data_ptr()), s_out.data_ptr<float>(), o_out.data_ptr<float>());
  C10_CUDA_CHECK(cudaGetLastError());
  return {s_out, o_out};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("probe", &probe, "wgmma tile steps on one tile"); }
