// Op `morphpipe::gather_rows` on the CPU, out[i] = source[index[i]] (feature gathering), and the row
// copy it shares with CpuBatcher; the copy itself is gather_rows_kernels.h, compiled per CPU level.
#include "cpu/gather_rows.h"

#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/gather_checks.h"

#define MORPHPIPE_KERNELS "cpu/gather_rows_kernels.h"
#include "cpu/for_each_capability.h"

namespace morphpipe {

void gather_rows_into(const at::Tensor& source, const int64_t* rows, int64_t count, at::Tensor& out, bool stream) {
  const int64_t row_bytes = source.size(1) * source.element_size();
  if (count == 0 || row_bytes == 0) return;
  const char* src = static_cast<const char*>(source.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  MORPHPIPE_CPU_DISPATCH(isa::gather_rows_kernel(src, rows, count, row_bytes, dst, stream));
}

namespace {

// out[i] = source[index[i]] after the checks, rows split across OpenMP threads; `stream` as gather_rows_into's.
void gather_checked_rows(const at::Tensor& source, const at::Tensor& index, const at::Tensor& out, bool stream,
                         const char* op) {
  const at::Tensor source_contiguous = source.contiguous();
  const at::Tensor index_contiguous = index.contiguous();
  const int64_t count = index_contiguous.numel();
  const int64_t num_rows = source_contiguous.size(0);
  const int64_t* rows = index_contiguous.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) check_gathered_row(i, rows[i], num_rows, op);
  constexpr int64_t kRowsPerTask = 256;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t begin = 0; begin < count; begin += kRowsPerTask) {
    const int64_t chunk = std::min(kRowsPerTask, count - begin);
    at::Tensor out_chunk = out.narrow(0, begin, chunk);
    gather_rows_into(source_contiguous, rows + begin, chunk, out_chunk, stream);
  }
}

// Op `morphpipe::gather_rows`: out[i] = source[index[i]] into a new tensor (fresh pages: ordinary stores).
at::Tensor gather_rows_cpu(const at::Tensor& source, const at::Tensor& index) {
  constexpr const char* op = "morphpipe::gather_rows";
  check_gather_rows(source, index, op);
  at::Tensor out = at::empty({index.numel(), source.size(1)}, source.options());
  gather_checked_rows(source, index, out, /*stream=*/false, op);
  return out;
}

// Op `morphpipe::gather_rows_out`: the same into a caller's (typically reused) buffer, with streaming stores.
void gather_rows_out_cpu(const at::Tensor& source, const at::Tensor& index, at::Tensor& out) {
  constexpr const char* op = "morphpipe::gather_rows_out";
  check_gather_rows(source, index, op);
  TORCH_CHECK(out.device().is_cpu() && out.is_contiguous() && out.dim() == 2 && out.size(0) == index.numel() &&
                  out.size(1) == source.size(1) && out.scalar_type() == source.scalar_type(),
              op, ": out must be a contiguous CPU tensor [", index.numel(), ", ", source.size(1), "] of ",
              source.scalar_type(), ", got ", out.scalar_type(), " ", out.sizes(), " on ", out.device());
  gather_checked_rows(source, index, out, /*stream=*/true, op);
}

}  // namespace

TORCH_LIBRARY_IMPL(morphpipe, CPU, m) {
  m.impl("gather_rows", &gather_rows_cpu);
  m.impl("gather_rows_out", &gather_rows_out_cpu);
}

}  // namespace morphpipe
