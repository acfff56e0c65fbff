// Route 1 feature gathering: out[i] = source[index[i]] where `source` is pinned host memory read
// over UVA (or a CUDA tensor), optionally with hot rows served from a device cache. A group of
// threads copies one row with the widest aligned vector loads (16, 8, 4 or 2 bytes as source, cache,
// output, row width and source row pitch allow), so consecutive threads read consecutive bytes of a row and the PCIe
// requests are full, coalesced cache lines (PyTorch-Direct's "aligned, coalesced" UVA access).
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "common/gather_checks.h"
#include "cuda/uva.cuh"

namespace morphpipe::cuda {
namespace {

template <typename vector_t>
__global__ void gather_rows_kernel(const char* source, int64_t source_pitch, const char* cache, const int32_t* slot,
                                   const int64_t* index, int64_t count, int64_t num_rows, int64_t row_bytes, int group,
                                   char* out, int64_t* status) {
  const int64_t thread = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int lane = static_cast<int>(thread % group);
  const int64_t groups = static_cast<int64_t>(gridDim.x) * blockDim.x / group;
  const int64_t row_vectors = row_bytes / static_cast<int64_t>(sizeof(vector_t));
  for (int64_t i = thread / group; i < count; i += groups) {
    const int64_t node = index[i];
    if (node < 0 || node >= num_rows) {
      if (lane == 0) report(status, kStatusIndexOutOfRange, i, node);
      continue;
    }
    const int32_t cached_row = slot != nullptr ? slot[node] : -1;
    const auto* from = reinterpret_cast<const vector_t*>(cached_row >= 0 ? cache + cached_row * row_bytes
                                                                          : source + node * source_pitch);
    auto* to = reinterpret_cast<vector_t*>(out + i * row_bytes);
    for (int64_t v = lane; v < row_vectors; v += group) to[v] = from[v];
  }
}

// The widest vector (16, 8, 4, 2 or 1 bytes) dividing the row width, the source's row pitch and every base address.
int vector_bytes(int64_t row_bytes, int64_t source_pitch, std::initializer_list<const void*> bases) {
  for (const int width : {16, 8, 4, 2}) {
    bool aligned = row_bytes % width == 0 && source_pitch % width == 0;
    for (const void* base : bases) aligned = aligned && reinterpret_cast<uintptr_t>(base) % width == 0;
    if (aligned) return width;
  }
  return 1;
}

// Threads per row: vectors per row rounded up to a power of two, at most a warp.
int threads_per_row(int64_t row_vectors) {
  int group = 1;
  while (group < row_vectors && group < kWarp) group *= 2;
  return group;
}

template <typename vector_t>
void launch(const char* source, int64_t source_pitch, const char* cache, const int32_t* slot, const int64_t* index,
            int64_t count, int64_t num_rows, int64_t row_bytes, char* out, int64_t* status) {
  const int group = threads_per_row(row_bytes / static_cast<int64_t>(sizeof(vector_t)));
  const int64_t threads = count * group;
  const auto blocks = static_cast<unsigned>(
      std::min<int64_t>((threads + kThreadsPerBlock - 1) / kThreadsPerBlock, int64_t{1} << 20));
  gather_rows_kernel<vector_t><<<blocks, kThreadsPerBlock, 0, current_stream()>>>(
      source, source_pitch, cache, slot, index, count, num_rows, row_bytes, group, out, status);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// `source` laid out row by row (unit stride along a row), which the kernel reads with its row pitch: a
// CUDA source of another layout is copied so on the device, as the CPU op copies; a host source cannot
// be (the copy would not be pinned), so that is an error naming the fix.
at::Tensor row_major_source(const at::Tensor& source, const char* op) {
  if (source.size(1) <= 1 || source.stride(1) == 1) return source;
  TORCH_CHECK(source.is_cuda(), op, ": source in host memory must have unit stride along its rows, got strides ",
              source.strides(), "; store it with .contiguous() and pin that copy");
  return source.contiguous();
}

at::Tensor gather_rows_cached_cuda(const at::Tensor& source_in, const at::Tensor& index, const at::Tensor& cache_slot,
                                   const at::Tensor& cache_rows, bool check_index) {
  constexpr const char* op = "morphpipe::gather_rows";
  check_gather_rows(source_in, index, op);
  TORCH_CHECK(index.is_cuda(), op, ": index must be a CUDA tensor (the device that gathers), got ", index.device());
  const auto device = index.device();
  const c10::cuda::CUDAGuard guard(device);
  const at::Tensor source = row_major_source(source_in, op);
  const int64_t num_rows = source.size(0), count = index.numel();
  const int64_t row_bytes = source.size(1) * source.element_size();
  const int64_t source_pitch = num_rows > 1 ? source.stride(0) * source.element_size() : row_bytes;
  at::Tensor out = at::empty({count, source.size(1)}, source.options().device(device).pinned_memory(false));
  if (count == 0 || row_bytes == 0) return out;
  const bool cached = cache_slot.numel() > 0;
  if (cached) check_row_cache(cache_slot, cache_rows, source, op);
  const at::Tensor index_contiguous = index.contiguous();
  const auto* from = static_cast<const char*>(device_address(source, device, op, "source", /*contiguous=*/false));
  const auto* slot = cached ? static_cast<const int32_t*>(device_address(cache_slot, device, op, "cache_slot"))
                            : nullptr;
  const auto* cache = cached ? static_cast<const char*>(device_address(cache_rows, device, op, "cache_rows"))
                             : nullptr;
  char* to = static_cast<char*>(out.data_ptr());
  // Unchecked calls (indices the sampler produced) skip the status record and its blocking read-back.
  const at::Tensor status = check_index ? new_status(device) : at::Tensor();
  int64_t* status_data = check_index ? status.data_ptr<int64_t>() : nullptr;
  const int64_t* rows = index_contiguous.data_ptr<int64_t>();
  switch (vector_bytes(row_bytes, source_pitch, {from, cache, to})) {
    case 16:
      launch<uint4>(from, source_pitch, cache, slot, rows, count, num_rows, row_bytes, to, status_data);
      break;
    case 8:
      launch<uint2>(from, source_pitch, cache, slot, rows, count, num_rows, row_bytes, to, status_data);
      break;
    case 4:
      launch<uint32_t>(from, source_pitch, cache, slot, rows, count, num_rows, row_bytes, to, status_data);
      break;
    case 2:
      launch<uint16_t>(from, source_pitch, cache, slot, rows, count, num_rows, row_bytes, to, status_data);
      break;
    default:
      launch<uint8_t>(from, source_pitch, cache, slot, rows, count, num_rows, row_bytes, to, status_data);
  }
  if (check_index) {
    const at::Tensor host_status = status.cpu();
    const int64_t* reported = host_status.data_ptr<int64_t>();
    if (reported[0] != kStatusOk) check_gathered_row(reported[1], reported[2], num_rows, op);
  }
  return out;
}

at::Tensor gather_rows_cuda(const at::Tensor& source, const at::Tensor& index) {
  const at::Tensor none = at::empty({0}, index.options().dtype(at::kInt));
  return gather_rows_cached_cuda(source, index, none, none, /*check_index=*/true);
}

}  // namespace

TORCH_LIBRARY_IMPL(morphpipe, CUDA, m) {
  m.impl("gather_rows", &gather_rows_cuda);
  m.impl("gather_rows_cached", &gather_rows_cached_cuda);
}

}  // namespace morphpipe::cuda
