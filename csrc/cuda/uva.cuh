// Shared by the Route 1 (GPU batching) kernels: addresses of tensors the GPU reads over unified
// virtual addressing (pinned host memory) or from its own memory, and a counter-based random source.
// Kernels report bad ids through the status record of status.cuh instead of reading them.
// Only c10's CUDA headers are used; launch constants and the stream come from aggregate_common.cuh.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/random.h"
#include "cuda/aggregate_common.cuh"
#include "cuda/status.cuh"

namespace morphpipe::cuda {

// The device address of host byte `p` of tensor `name`, which must lie in page-locked, mapped memory.
inline const char* mapped_host_byte(const char* p, const char* op, const char* name, const char* which) {
  cudaPointerAttributes attributes{};
  const cudaError_t status = cudaPointerGetAttributes(&attributes, p);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();  // clear the non-sticky error so later launch checks do not report it
    TORCH_CHECK(false, op, ": cannot query the ", which, " byte of ", name, " (", cudaGetErrorString(status), ")");
  }
  TORCH_CHECK(attributes.type == cudaMemoryTypeHost && attributes.devicePointer != nullptr, op, ": the ", which,
              " byte of ", name, " is in pageable host memory, which the GPU cannot read; pin the whole tensor "
              "first (morphpipe.sampling.pinning.HostPinning registers it in place, or use .pin_memory() to copy it "
              "into pinned memory)");
  return static_cast<const char*>(attributes.devicePointer);
}

// The address a kernel on `device` dereferences to read `t`: its own for a CUDA tensor there, the
// mapped address for a page-locked host tensor (cudaHostRegister'ed or allocated pinned). Both the
// first and the last byte `t` spans (by its sizes and strides, which must be >= 0) are checked, and
// must map to device addresses as far apart as the host ones (one registration), so a tensor that is
// only partly pinned is an error rather than a read of unmapped memory. Pageable host memory cannot be
// read by the GPU, so it is an error naming the tensor and the fix. `contiguous` requires a dense tensor.
inline const void* device_address(const at::Tensor& t, const at::Device& device, const char* op, const char* name,
                                  bool contiguous = true) {
  if (t.numel() == 0) return nullptr;
  TORCH_CHECK(!contiguous || t.is_contiguous(), op, ": ", name, " must be contiguous; call .contiguous()");
  if (t.is_cuda()) {
    TORCH_CHECK(t.device() == device, op, ": ", name, " is on ", t.device(), " but the op runs on ", device);
    return t.data_ptr();
  }
  TORCH_CHECK(t.device().is_cpu(), op, ": ", name, " must be a CUDA tensor or pinned host memory, got ", t.device());
  int64_t last_element = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    TORCH_CHECK(t.stride(d) >= 0, op, ": ", name, " has a negative stride; call .contiguous()");
    last_element += (t.size(d) - 1) * t.stride(d);
  }
  const int64_t span = (last_element + 1) * static_cast<int64_t>(t.element_size());
  const char* first = static_cast<const char*>(t.data_ptr());
  const char* device_first = mapped_host_byte(first, op, name, "first");
  const char* device_last = mapped_host_byte(first + span - 1, op, name, "last");
  TORCH_CHECK(device_last - device_first == span - 1, op, ": ", name, " spans ", span,
              " bytes that are not one pinned registration; pin the whole tensor at once (HostPinning)");
  return device_first;
}

// Counter-based draws: the value depends only on (key, counter), never on which thread or in which
// order it is drawn, so sampling is deterministic for a seed whatever the launch configuration.
// Uniform in [0, bound): Lemire's multiply-high with rejection of the biased low products.
__device__ __forceinline__ uint64_t uniform_below(uint64_t key, uint64_t counter, uint64_t bound) {
  const uint64_t stream = splitmix64(key ^ splitmix64(counter));
  for (uint64_t attempt = 0;; ++attempt) {
    const uint64_t draw = splitmix64(stream + attempt * 0xD1B54A32D192ED03ULL);
    const uint64_t low = draw * bound;
    if (low >= bound || low >= (0 - bound) % bound) return __umul64hi(draw, bound);
  }
}

}  // namespace morphpipe::cuda
