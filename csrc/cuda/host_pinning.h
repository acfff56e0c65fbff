// Page-locking existing host tensors in place (cudaHostRegister), so the GPU reads them over UVA
// without a pinned copy of the graph. Bound in python_module.cpp when built with CUDA.
#pragma once

#include <ATen/ATen.h>

#include <string>

namespace morphpipe::cuda {

// Registers t's bytes as pinned, mapped and portable (read-only for the device when `read_only`).
// Without `read_only`, a copy-on-write file mapping would have every page copied by the driver: the
// caller refuses those first (morphpipe.sampling.pinning.check_registrable).
// Returns "" on success, else CUDA's error text; the runtime's last-error state is cleared either way.
std::string host_register(const at::Tensor& t, bool read_only);

// Undoes host_register for the same tensor; "" on success, else CUDA's error text.
std::string host_unregister(const at::Tensor& t);

// Whether the current device accepts read-only registrations (cudaHostRegisterReadOnly).
bool host_register_read_only_supported();

}  // namespace morphpipe::cuda
