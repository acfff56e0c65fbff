// Shared by the Route 1 (GPU batching) kernels: addresses of tensors the GPU reads over unified
// virtual addressing (pinned host memory) or from its own memory, a counter-based random source,
// and a small device status record through which kernels report bad ids instead of reading them.
// Only c10's CUDA headers are used; launch constants and the stream come from aggregate_common.cuh.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cpu/random.h"
#include "cuda/aggregate_common.cuh"

namespace morphpipe::cuda {

// The address a kernel on `device` dereferences to read `t`: its own for a CUDA tensor there, the
// mapped address for a page-locked host tensor (cudaHostRegister'ed or allocated pinned). Pageable
// host memory cannot be read by the GPU, so it is an error naming the tensor and the fix.
inline const void* device_address(const at::Tensor& t, const at::Device& device, const char* op, const char* name) {
  if (t.numel() == 0) return nullptr;
  TORCH_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous; call .contiguous()");
  if (t.is_cuda()) {
    TORCH_CHECK(t.device() == device, op, ": ", name, " is on ", t.device(), " but the op runs on ", device);
    return t.data_ptr();
  }
  TORCH_CHECK(t.device().is_cpu(), op, ": ", name, " must be a CUDA tensor or pinned host memory, got ", t.device());
  cudaPointerAttributes attributes{};
  const cudaError_t status = cudaPointerGetAttributes(&attributes, t.data_ptr());
  if (status != cudaSuccess) {
    (void)cudaGetLastError();  // clear the non-sticky error so later launch checks do not report it
    TORCH_CHECK(false, op, ": cannot query ", name, " (", cudaGetErrorString(status), ")");
  }
  TORCH_CHECK(attributes.type == cudaMemoryTypeHost && attributes.devicePointer != nullptr, op, ": ", name,
              " is in pageable host memory, which the GPU cannot read; pin it first (morphpipe.sampling.pinning."
              "HostPinning registers it in place, or use .pin_memory() to copy it into pinned memory)");
  return attributes.devicePointer;
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

// A device record of the first bad input a kernel met: kind, position, value (int64 [3]).
enum StatusKind : int64_t {
  kStatusOk = 0,
  kStatusSeedOutOfRange = 1,
  kStatusSeedRepeated = 2,
  kStatusNeighbourOutOfRange = 3,
  kStatusIndexOutOfRange = 4,
};

__device__ __forceinline__ void report(int64_t* status, int64_t kind, int64_t position, int64_t value) {
  if (atomicCAS(reinterpret_cast<unsigned long long*>(status), 0ULL, static_cast<unsigned long long>(kind)) == 0ULL) {
    status[1] = position;
    status[2] = value;
  }
}

inline at::Tensor new_status(const at::Device& device) {
  return at::zeros({3}, at::TensorOptions().dtype(at::kLong).device(device));
}

}  // namespace morphpipe::cuda
