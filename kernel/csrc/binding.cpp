// The torch binding: every argument check lives here, each error names its argument.
//
// Shape and dtype checks are free (host metadata). Checks that read device data (indptr
// monotonic, T_b >= 1, slots inside the pool, a tree that sees itself) need a copy to the host,
// so they run only when `validate` is true and the stream is not being captured into a graph.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "checks.h"
#include "messages.h"
#include "verify_attention.h"

namespace {

constexpr int64_t kQKDim = 576;
constexpr int64_t kVDim = 512;
// The most (token, head) rows a call may have, and the most kv_indices entries (see the checks).
constexpr int64_t kMaxRows = int64_t{1} << 30;
// An unsplit request's split length is its key count rounded up to whole tiles; the plan adds
// it to a position and rounds up again in int32. With 48-key tiles (wgmma-ws) 2^30 keys round up
// to 2^30 + 32, and that sum passed 2^31 - 1: the split count wrapped to -1 and every row read
// NaN. 64 keys below 2^30 leave room for the widest tile's rounding.
constexpr int64_t kMaxKeys = (int64_t{1} << 30) - 64;

using va_checks::check_no_overlap;
using va_checks::check_tensor;
using va_messages::text;

std::string shape_str(const at::Tensor& t) { return text(t.sizes()); }

void check_indptr_values(const std::vector<int32_t>& v, const char* name, int64_t last_expected,
                         const char* last_what) {
  VA_CHECK(v[0] == 0, name, "[0] must be 0, got ", v[0]);
  for (size_t i = 1; i < v.size(); ++i)
    VA_CHECK(v[i] >= v[i - 1], name, " must be non-decreasing: ", name, "[", i, "] = ", v[i], " < ", name, "[",
                i - 1, "] = ", v[i - 1]);
  VA_CHECK(v.back() == last_expected, name, "[-1] = ", v.back(), " must equal ", last_what, " = ",
              last_expected);
}

std::vector<int32_t> to_host(const at::Tensor& t) {
  at::Tensor h = t.to(at::kCPU);
  return std::vector<int32_t>(h.data_ptr<int32_t>(), h.data_ptr<int32_t>() + h.numel());
}

void validate_data(const at::Tensor& q, const at::Tensor& kv_indices, const at::Tensor& qo_indptr,
                   const at::Tensor& kv_indptr, const at::Tensor& tree_mask, const at::Tensor& tree_mask_indptr,
                   int64_t num_slots) {
  const int64_t N = q.size(0), K = kv_indices.numel();
  const auto qo = to_host(qo_indptr), kvp = to_host(kv_indptr), tmp = to_host(tree_mask_indptr);
  check_indptr_values(qo, "qo_indptr", N, "q.size(0)");
  check_indptr_values(kvp, "kv_indptr", K, "kv_indices.numel()");
  check_indptr_values(tmp, "tree_mask_indptr", tree_mask.numel(), "tree_mask.numel()");
  const int64_t B = static_cast<int64_t>(qo.size()) - 1;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t T = qo[b + 1] - qo[b], len = kvp[b + 1] - kvp[b];
    VA_CHECK(T >= 1, "request ", b, " has no draft token (qo_indptr[", b + 1, "] == qo_indptr[", b,
                "] = ", qo[b], "); every request needs T_b >= 1");
    VA_CHECK(len >= T, "request ", b, " has ", len, " KV slots (kv_indptr) but ", T,
                " draft tokens (qo_indptr); its slots must be its prefix then its draft tokens");
    const int64_t words = (T + 31) / 32;
    VA_CHECK(tmp[b + 1] - tmp[b] == T * words, "tree_mask_indptr: request ", b, " has ", tmp[b + 1] - tmp[b],
                " words, expected T_b * ceil(T_b / 32) = ", T * words);
  }
  if (K > 0) {
    auto [mn, mx] = at::aminmax(kv_indices);
    const int64_t lo = mn.item<int32_t>(), hi = mx.item<int32_t>();
    if (lo < 0 || hi >= num_slots) {
      const at::Tensor bad = at::nonzero((kv_indices < 0).logical_or(kv_indices >= num_slots)).to(at::kCPU);
      const int64_t i = bad[0][0].item<int64_t>();
      VA_CHECK(false, "kv_indices[", i, "] = ", kv_indices[i].item<int32_t>(), " is outside the pool of ",
                  num_slots, " slots (kv_cache.size(0))");
    }
  }
  // Every draft token must see itself: otherwise a row with no prefix could see nothing at all.
  const auto mask = to_host(tree_mask);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t T = qo[b + 1] - qo[b], words = (T + 31) / 32;
    for (int64_t i = 0; i < T; ++i) {
      const uint32_t w = static_cast<uint32_t>(mask[tmp[b] + i * words + i / 32]);
      VA_CHECK((w >> (i % 32)) & 1u, "tree_mask: draft token ", i, " of request ", b,
                  " does not see itself (its diagonal bit is 0)");
    }
  }
}

// Config ids (va::ConfigId) by name, as kernel/__init__.py spells them.
constexpr const char* kConfigNames[] = {"auto", "large", "small", "wgmma", "wgmma-ws", "small-m32", "wgmma-ws-pipe"};
constexpr int64_t kNumConfigs = sizeof(kConfigNames) / sizeof(kConfigNames[0]);
// The most SMs a call may be laid out for (`num_sms` in kernel/__init__.py, which keeps the same
// bound): more than any GPU has, and a partial workspace of at most ~135 MB.
constexpr int64_t kMaxPlanSms = 1024;

void check_num_sms(int64_t num_sms) {
  VA_CHECK(num_sms >= 0 && num_sms <= kMaxPlanSms, "num_sms must be 1 to ", kMaxPlanSms,
           " (or 0 / None: the device's own SM count), got ", num_sms);
}

void check_config(int64_t config) {
  if (config >= 0 && config < kNumConfigs) return;
  std::string known;
  for (int64_t i = 0; i < kNumConfigs; ++i)
    known += (i ? ", " : "") + std::to_string(i) + " (" + kConfigNames[i] + ")";
  VA_CHECK(false, "config must be one of ", known, "; got ", config);
}

std::vector<at::Tensor> verify_attention(const at::Tensor& q, const at::Tensor& kv_cache_in,
                                         const at::Tensor& kv_indices, const at::Tensor& qo_indptr,
                                         const at::Tensor& kv_indptr, const at::Tensor& tree_mask,
                                         const at::Tensor& tree_mask_indptr, double sm_scale,
                                         c10::optional<at::Tensor> out_opt, c10::optional<at::Tensor> lse_opt,
                                         bool validate, int64_t config, int64_t num_sms) {
  // q [N, H, 576] bf16, kv_cache [S, 576] or [S, 1, 576] bf16
  VA_CHECK(q.is_cuda(), "q must be a CUDA tensor, got device ", q.device());
  const at::Device device = q.device();
  check_tensor(q, "q", at::kBFloat16, device);
  VA_CHECK(q.dim() == 3 && q.size(2) == kQKDim, "q must be [num_tokens, num_heads, 576], got ", shape_str(q));
  // Checked as the caller passed it, so that a message shows the caller's shape and strides.
  check_tensor(kv_cache_in, "kv_cache", at::kBFloat16, device);
  const bool kv_3d = kv_cache_in.dim() == 3 && kv_cache_in.size(1) == 1 && kv_cache_in.size(2) == kQKDim;
  VA_CHECK(kv_3d || (kv_cache_in.dim() == 2 && kv_cache_in.size(1) == kQKDim),
           "kv_cache must be [num_slots, 576] or [num_slots, 1, 576] (MLA: one KV head), got ",
           shape_str(kv_cache_in));
  const at::Tensor kv_cache = kv_3d ? kv_cache_in.view({kv_cache_in.size(0), kQKDim}) : kv_cache_in;
  check_tensor(kv_indices, "kv_indices", at::kInt, device);
  check_tensor(qo_indptr, "qo_indptr", at::kInt, device);
  check_tensor(kv_indptr, "kv_indptr", at::kInt, device);
  check_tensor(tree_mask, "tree_mask", at::kInt, device);
  check_tensor(tree_mask_indptr, "tree_mask_indptr", at::kInt, device);
  VA_CHECK(kv_indices.dim() == 1, "kv_indices must be 1-D [K], got ", shape_str(kv_indices));
  VA_CHECK(tree_mask.dim() == 1, "tree_mask must be 1-D (packed words), got ", shape_str(tree_mask));
  VA_CHECK(qo_indptr.dim() == 1 && qo_indptr.size(0) >= 1, "qo_indptr must be 1-D [B+1], got ",
              shape_str(qo_indptr));
  const int64_t B = qo_indptr.size(0) - 1, N = q.size(0), H = q.size(1), S = kv_cache.size(0);
  VA_CHECK(kv_indptr.dim() == 1 && kv_indptr.size(0) == B + 1, "kv_indptr must be [B+1] = [", B + 1,
              "] like qo_indptr, got ", shape_str(kv_indptr));
  VA_CHECK(tree_mask_indptr.dim() == 1 && tree_mask_indptr.size(0) == B + 1, "tree_mask_indptr must be [B+1] = [",
              B + 1, "] like qo_indptr, got ", shape_str(tree_mask_indptr));
  VA_CHECK(H >= 1, "q must have at least one head, got ", shape_str(q));
  VA_CHECK(N >= B, "q has ", N, " tokens (q.size(0)) but qo_indptr has ", B,
           " requests, each with at least one draft token");
  const int64_t int_max = std::numeric_limits<int32_t>::max();
  VA_CHECK(S <= int_max, "kv_cache has ", S, " slots; at most 2^31 - 1 are supported (int32 kv_indices)");
  // The plan counts rows and key positions in int32 and rounds them up by up to their own size
  // (a split's end can reach twice the last position), so both stay within 2^30. H on its own
  // too: with no tokens N * H bounds nothing, and the plan takes H as an int.
  VA_CHECK(H <= kMaxRows && N * H <= kMaxRows, "q.size(0) * q.size(1) (tokens x heads) = ", N * H, " and q.size(1) = ",
           H, " must each be at most ", kMaxRows, " (2^30)");
  VA_CHECK(kv_indices.numel() <= kMaxKeys, "kv_indices has ", kv_indices.numel(), " entries; at most ", kMaxKeys,
           " (2^30 - 64) are supported");
  VA_CHECK(std::isfinite(sm_scale) && sm_scale > 0, "sm_scale must be a finite positive number, got ", sm_scale);
  // The kernel computes in float32 with the scale times log2(e) (launch_impl): a double that is
  // finite and positive but becomes 0 or inf there would give an average of V or NaN, silently.
  const float scale_f = static_cast<float>(sm_scale);
  VA_CHECK(std::isnormal(scale_f) && std::isfinite(scale_f * 1.4426950408889634f), "sm_scale = ", sm_scale,
           " is outside float32's normal range (about 1.2e-38 to 2.3e38) that the kernel computes in");
  check_config(config);
  check_num_sms(num_sms);

  at::Tensor out = out_opt.has_value() ? *out_opt : at::empty({N, H, kVDim}, q.options());
  at::Tensor lse = lse_opt.has_value() ? *lse_opt : at::empty({N, H}, q.options().dtype(at::kFloat));
  check_tensor(out, "out", at::kBFloat16, device);
  VA_CHECK(out.dim() == 3 && out.size(0) == N && out.size(1) == H && out.size(2) == kVDim, "out must be [", N,
              ", ", H, ", 512], got ", shape_str(out));
  check_tensor(lse, "lse", at::kFloat, device);
  VA_CHECK(lse.dim() == 2 && lse.size(0) == N && lse.size(1) == H, "lse must be [", N, ", ", H, "], got ",
              shape_str(lse));
  const std::pair<const at::Tensor*, const char*> inputs[] = {
      {&q, "q"},
      {&kv_cache, "kv_cache"},
      {&kv_indices, "kv_indices"},
      {&qo_indptr, "qo_indptr"},
      {&kv_indptr, "kv_indptr"},
      {&tree_mask, "tree_mask"},
      {&tree_mask_indptr, "tree_mask_indptr"}};
  for (const auto& [t, name] : inputs) {
    check_no_overlap(out, "out", *t, name);
    check_no_overlap(lse, "lse", *t, name);
  }
  check_no_overlap(lse, "lse", out, "out");

  const c10::cuda::CUDAGuard guard(device);
  if (validate && c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None)
    validate_data(q, kv_indices, qo_indptr, kv_indptr, tree_mask, tree_mask_indptr, S);

  // An empty batch launches nothing, but a config this device cannot run is refused all the same:
  // the plan is made for one token so that a caller learns it before the first real batch.
  va::Plan plan{};
  cudaError_t e = va::make_plan(device.index(), static_cast<int>(std::max<int64_t>(B, 1)),
                                static_cast<int>(std::max<int64_t>(N, 1)), static_cast<int>(H),
                                static_cast<int>(kv_indices.numel()), static_cast<int>(config),
                                static_cast<int>(num_sms), &plan);
  VA_CHECK(e != cudaErrorNotSupported, "config ", config, " (", kConfigNames[config],
           ") needs a compute capability 9.0 GPU (H100/H200) and a ",
           "build for sm_90a; this build ", va::wgmma_built() ? "has" : "lacks", " sm_90a code and ", device,
           " is not such a GPU or lacks the shared memory");
  // make_plan names the config it resolved (`auto` too) and its size when the device cannot hold it.
  VA_CHECK(e != cudaErrorInvalidValue, "config ", config, " (", kConfigNames[config],
           config == 0 ? std::string(" -> ") + kConfigNames[plan.config] : std::string(), ") needs ",
           plan.smem_bytes, " bytes of shared memory per block, more than ", device, " allows");
  C10_CUDA_CHECK(e);
  if (B == 0) return {out, lse};
  at::Tensor workspace = at::empty({static_cast<int64_t>(plan.workspace_bytes)}, q.options().dtype(at::kByte));

  va::Args args{};
  args.q = q.data_ptr();
  args.kv = kv_cache.data_ptr();
  args.kv_indices = kv_indices.data_ptr<int32_t>();
  args.qo_indptr = qo_indptr.data_ptr<int32_t>();
  args.kv_indptr = kv_indptr.data_ptr<int32_t>();
  args.tree_mask = tree_mask.data_ptr<int32_t>();
  args.tree_mask_indptr = tree_mask_indptr.data_ptr<int32_t>();
  args.out = out.data_ptr();
  args.lse = lse.data_ptr<float>();
  args.workspace = workspace.data_ptr();
  args.batch = static_cast<int>(B);
  args.num_tokens = static_cast<int>(N);
  args.num_heads = static_cast<int>(H);
  args.num_slots = static_cast<int>(S);
  args.num_kv_indices = static_cast<int>(kv_indices.numel());
  args.sm_scale = scale_f;
  C10_CUDA_CHECK(va::launch(args, plan, c10::cuda::getCurrentCUDAStream(device.index()).stream()));
  return {out, lse};
}

std::string build_info() { return va::build_info(); }

// The tile config a call of these shapes runs (what `config` resolves to on this device): the
// same make_plan as the call, so the two cannot disagree. Shapes only; nothing is launched.
int64_t planned_config(int64_t device_index, int64_t batch, int64_t num_tokens, int64_t num_heads,
                       int64_t num_kv_indices, int64_t config, int64_t num_sms) {
  check_config(config);
  check_num_sms(num_sms);
  VA_CHECK(batch >= 1 && num_tokens >= batch && num_heads >= 1 && num_kv_indices >= 0,
           "planned_config needs batch >= 1, num_tokens >= batch, num_heads >= 1, num_kv_indices >= 0; got ", batch,
           ", ", num_tokens, ", ", num_heads, ", ", num_kv_indices);
  VA_CHECK(num_heads <= kMaxRows && num_tokens * num_heads <= kMaxRows && num_kv_indices <= kMaxKeys,
           "planned_config: num_heads = ", num_heads, " and num_tokens * num_heads = ", num_tokens * num_heads,
           " must each be at most ", kMaxRows, " (2^30), and num_kv_indices = ", num_kv_indices, " at most ",
           kMaxKeys, " (2^30 - 64), as verify_attention's");
  // make_plan asks the driver about the kernels of the current device: make it this one.
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  va::Plan plan{};
  const cudaError_t e = va::make_plan(static_cast<int>(device_index), static_cast<int>(batch),
                                      static_cast<int>(num_tokens), static_cast<int>(num_heads),
                                      static_cast<int>(num_kv_indices), static_cast<int>(config),
                                      static_cast<int>(num_sms), &plan);
  if (e == cudaErrorNotSupported || e == cudaErrorInvalidValue) return -1;  // this device cannot run it
  C10_CUDA_CHECK(e);
  return plan.config;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("verify_attention", &verify_attention, "MLA tree verify attention (see kernel/__init__.py)", py::arg("q"),
        py::arg("kv_cache"), py::arg("kv_indices"), py::arg("qo_indptr"), py::arg("kv_indptr"), py::arg("tree_mask"),
        py::arg("tree_mask_indptr"), py::arg("sm_scale"), py::arg("out") = py::none(), py::arg("lse") = py::none(),
        py::arg("validate") = true, py::arg("config") = 0, py::arg("num_sms") = 0);
  m.def("build_info", &build_info, "kernel configuration and compiler");
  m.def("planned_config", &planned_config, "the tile config a call of these shapes runs on this device (-1: cannot run)",
        py::arg("device_index"), py::arg("batch"), py::arg("num_tokens"), py::arg("num_heads"),
        py::arg("num_kv_indices"), py::arg("config") = 0, py::arg("num_sms") = 0);
}
