// Python bindings for what is not a stateless op: the threaded CPU batcher and build facts.
#include <torch/extension.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu/cpu_batcher.h"
#ifdef MORPHPIPE_WITH_CUDA
#include "cuda/host_pinning.h"
#endif

namespace py = pybind11;
using morphpipe::CpuBatch;
using morphpipe::CpuBatcher;

namespace {

py::object batch_to_python(std::optional<CpuBatch> batch) {
  if (!batch) return py::none();
  py::object pairs = py::none();
  if (batch->edge_ids.defined()) {
    pairs = py::make_tuple(batch->edge_ids, batch->pair_src, batch->pair_dst, batch->negative_dst);
  }
  return py::make_tuple(batch->batch_index, batch->seeds, batch->input_nodes, batch->block_indptrs,
                        batch->block_indices, batch->x, batch->y, batch->build_seconds, pairs);
}

int openmp_max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 0;
#endif
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "morphpipe native ops (registered under torch.ops.morphpipe) and the CPU batcher";
  m.def("openmp_max_threads", &openmp_max_threads, "OpenMP threads available to native kernels (0: built without OpenMP)");
  m.def("built_with_cuda", [] {
#ifdef MORPHPIPE_WITH_CUDA
    return true;
#else
    return false;
#endif
  });

#ifdef MORPHPIPE_WITH_CUDA
  m.def("cuda_host_register", &morphpipe::cuda::host_register, py::arg("tensor"), py::arg("read_only"),
        "cudaHostRegister on the tensor's memory: '' on success, else CUDA's error text");
  m.def("cuda_host_unregister", &morphpipe::cuda::host_unregister, py::arg("tensor"),
        "cudaHostUnregister on the tensor's memory: '' on success, else CUDA's error text");
  m.def("cuda_host_register_read_only_supported", &morphpipe::cuda::host_register_read_only_supported);
#endif

  py::class_<CpuBatcher>(m, "CpuBatcher")
      .def(py::init<at::Tensor, at::Tensor, at::Tensor, at::Tensor, std::vector<int64_t>, int64_t, int64_t, bool>(),
           py::arg("indptr"), py::arg("indices"), py::arg("features"), py::arg("labels"), py::arg("fanouts"),
           py::arg("num_threads"), py::arg("queue_size"), py::arg("pin_memory"))
      .def(
          "set_edge_task",
          [](CpuBatcher& self, at::Tensor pair_src, at::Tensor pair_dst, int64_t num_negatives,
             std::optional<at::Tensor> negative_cdf, bool exclude, bool undirected, bool reject_positives) {
            py::gil_scoped_release release;
            self.set_edge_task(morphpipe::EdgeTask{std::move(pair_src), std::move(pair_dst), num_negatives,
                                                   negative_cdf.value_or(at::Tensor()), exclude, undirected,
                                                   reject_positives});
          },
          py::arg("pair_src"), py::arg("pair_dst"), py::arg("num_negatives"), py::arg("negative_cdf"),
          py::arg("exclude"), py::arg("undirected"), py::arg("reject_positives"),
          "batches of training edge ids from now on (order = edge ids); see csrc/cpu/edge_batch.h")
      .def("start_epoch", &CpuBatcher::start_epoch, py::arg("order"), py::arg("batch_size"), py::arg("drop_last"),
           py::arg("epoch_seed"), py::call_guard<py::gil_scoped_release>())
      .def(
          "next",
          [](CpuBatcher& self) {
            std::optional<CpuBatch> batch;
            {
              py::gil_scoped_release release;
              batch = self.next();
            }
            return batch_to_python(std::move(batch));
          },
          "(batch_index, seeds, input_nodes, block_indptrs, block_indices, x, y, build_seconds, pairs) or None at "
          "epoch end; pairs: (edge_ids, src, dst, negative_dst) of an edge task, else None")
      .def("stop", &CpuBatcher::stop, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("num_batches", &CpuBatcher::num_batches)
      .def_property_readonly("num_threads", &CpuBatcher::num_threads);
}
