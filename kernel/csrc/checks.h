// The binding's checks of one tensor, and of an output against an input: metadata only (no sync).
//
// Header-only and CUDA-free, so a CPU build of torch can compile and test them
// (tests/test_binding_checks.py); kernel/csrc/binding.cpp applies them to every argument.
#pragma once

#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>

#include <cstdint>

#include "messages.h"

namespace va_checks {

inline void check_tensor(const at::Tensor& t, const char* name, at::ScalarType dtype, const at::Device& device) {
  VA_CHECK(t.device() == device, name, " must be on ", device, " (where q is), got ", t.device());
  VA_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
  VA_CHECK(t.is_contiguous(), name, " must be contiguous (shape ", va_messages::text(t.sizes()), ", strides ", va_messages::text(t.strides()), ")");
  // The bf16 tensors are read 4 and 16 bytes at a time and written 4 and 8 at a time (a view at an
  // odd element offset is not aligned; the access would fault and end the CUDA context). The int32
  // and fp32 ones are read and written whole: torch's own views keep them aligned, but a tensor
  // taken from another library (DLPack, __cuda_array_interface__) may start at any byte.
  const auto addr = reinterpret_cast<uintptr_t>(t.data_ptr());
  const uintptr_t align = dtype == at::kBFloat16 ? 16 : static_cast<uintptr_t>(t.element_size());
  VA_CHECK(addr % align == 0, name, " must start at a ", static_cast<int64_t>(align),
           "-byte aligned address, got one ", static_cast<int64_t>(addr % align),
           " bytes past it (a view at an element offset?)");
}

// out and lse are written while other blocks still read the inputs (and the combine reads the
// partials, not out): an output that shares memory with an input, or with the other output, gives
// a wrong result that changes from run to run. Metadata only (no sync).
inline void check_no_overlap(const at::Tensor& written, const char* written_name, const at::Tensor& other,
                      const char* other_name) {
  VA_CHECK(at::get_overlap_status(written, other) == at::MemOverlapStatus::No, written_name,
           " must not share memory with ", other_name, " (the kernel writes ", written_name, " while it reads ",
           other_name, ")");
}

}  // namespace va_checks
