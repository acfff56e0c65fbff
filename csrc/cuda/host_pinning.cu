// cudaHostRegister / cudaHostUnregister on tensors' memory, with the error text returned rather
// than left in the runtime's last-error state (where a later kernel launch check would find it).
#include "host_pinning.h"

#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime.h>

namespace morphpipe::cuda {

namespace {

std::string outcome(cudaError_t status) {
  if (status == cudaSuccess) return "";
  (void)cudaGetLastError();
  return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
}

void check_host_tensor(const at::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu(), "host pinning: expected a CPU tensor, got one on ", t.device());
  TORCH_CHECK(t.is_contiguous(), "host pinning: the tensor must be contiguous (one address range); "
              "call .contiguous() first, which copies it");
  TORCH_CHECK(t.numel() > 0, "host pinning: an empty tensor has no memory to register");
}

}  // namespace

std::string host_register(const at::Tensor& t, bool read_only) {
  check_host_tensor(t);
  unsigned int flags = cudaHostRegisterPortable | cudaHostRegisterMapped;
  if (read_only) flags |= cudaHostRegisterReadOnly;
  return outcome(cudaHostRegister(t.data_ptr(), t.nbytes(), flags));
}

std::string host_unregister(const at::Tensor& t) {
  check_host_tensor(t);
  return outcome(cudaHostUnregister(t.data_ptr()));
}

bool host_register_read_only_supported() {
  int supported = 0;
  const cudaError_t status =
      cudaDeviceGetAttribute(&supported, cudaDevAttrHostRegisterReadOnlySupported, c10::cuda::current_device());
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return supported != 0;
}

}  // namespace morphpipe::cuda
