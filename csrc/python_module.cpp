// Python bindings for what is not a stateless op: the threaded CPU batcher, the feature store and build facts.
#include <torch/extension.h>

#include <string>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu/buffer_pool.h"
#include "cpu/cpu_batcher.h"
#include "cpu/cpu_capability.h"
#include "cpu/disk_probe.h"
#include "cpu/feature_store.h"
#include "cpu/io_uring.h"
#include "cpu/reuse_allocator.h"
#include "cpu/hetero_batcher.h"
#ifdef MORPHPIPE_WITH_CUDA
#include "cuda/host_pinning.h"
#endif

namespace py = pybind11;
using morphpipe::BufferPool;
using morphpipe::CpuBatch;
using morphpipe::CpuBatcher;
using morphpipe::FeatureStore;
using morphpipe::HeteroCpuBatch;
using morphpipe::HeteroCpuBatcher;

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

py::object hetero_batch_to_python(std::optional<HeteroCpuBatch> batch) {
  if (!batch) return py::none();
  return py::make_tuple(batch->batch_index, batch->seeds, batch->input_nodes, batch->indptrs, batch->indices,
                        batch->counts, batch->x, batch->y, batch->build_seconds);
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
  m.doc() = "morphpipe native ops (registered under torch.ops.morphpipe), the CPU batcher and the feature store";
  m.def("openmp_max_threads", &openmp_max_threads, "OpenMP threads available to native kernels (0: built without OpenMP)");
  m.def("built_with_cuda", [] {
#ifdef MORPHPIPE_WITH_CUDA
    return true;
#else
    return false;
#endif
  });

  m.def(
      "cpu_capability", [] { return std::string(morphpipe::capability_name(morphpipe::active_cpu_capability())); },
      "the instruction-set level the CPU kernels run at: baseline, avx2 or avx512");
  m.def("set_cpu_capability", &morphpipe::set_cpu_capability, py::arg("name"),
        "runs the CPU kernels at level `name`; ValueError when it is unknown or this CPU lacks it");
  m.def("cpu_capabilities", &morphpipe::cpu_capabilities,
        "(name, compiled into this build, supported by this CPU) for every level, lowest first");
  m.def("take_dispatched_capabilities", &morphpipe::take_dispatched_capabilities,
        "bit i set when a kernel of level i (baseline, avx2, avx512) ran since the last call; clears the record");

#ifdef MORPHPIPE_WITH_CUDA
  m.def("cuda_host_register", &morphpipe::cuda::host_register, py::arg("tensor"), py::arg("read_only"),
        "cudaHostRegister on the tensor's memory: '' on success, else CUDA's error text");
  m.def("cuda_host_unregister", &morphpipe::cuda::host_unregister, py::arg("tensor"),
        "cudaHostUnregister on the tensor's memory: '' on success, else CUDA's error text");
  m.def("cuda_host_register_read_only_supported", &morphpipe::cuda::host_register_read_only_supported);
#endif

  m.def("io_uring_unavailable_reason", &morphpipe::IoUring::unavailable_reason,
        "why io_uring cannot be used in this process (io_uring_setup's error), or '' when it can");
  m.def(
      "measure_random_reads",
      [](const std::string& path, int64_t block, int64_t queue_depth, double seconds, bool io_uring) {
        morphpipe::DiskReadRate rate;
        {
          py::gil_scoped_release release;
          rate = morphpipe::measure_random_reads(path, block, queue_depth, seconds, io_uring);
        }
        return py::make_tuple(rate.reads, rate.bytes, rate.seconds);
      },
      py::arg("path"), py::arg("block"), py::arg("queue_depth"), py::arg("seconds"), py::arg("io_uring") = false,
      "O_DIRECT reads of `block` bytes at random offsets of `path`, queue_depth at once (threads, or one io_uring): "
      "(reads, bytes, seconds)");
  m.def(
      "measure_sequential_reads",
      [](const std::string& path, int64_t block, double seconds) {
        morphpipe::DiskReadRate rate;
        {
          py::gil_scoped_release release;
          rate = morphpipe::measure_sequential_reads(path, block, seconds);
        }
        return py::make_tuple(rate.reads, rate.bytes, rate.seconds);
      },
      py::arg("path"), py::arg("block"), py::arg("seconds"),
      "O_DIRECT reads of `block` bytes one after another through `path`: (reads, bytes, seconds)");

  m.def("install_cpu_memory_reuse", &morphpipe::install_cpu_memory_reuse, py::arg("min_bytes"),
        py::arg("max_waste"),
        "makes torch's CPU allocator keep freed blocks of min_bytes or more for reuse, each lent only to a request of "
        "at least 1/max_waste of its size (0: any request it holds); once per process (False when already "
        "installed)");
  m.def(
      "cpu_memory_reuse",
      [] {
        const morphpipe::CpuMemoryReuse s = morphpipe::cpu_memory_reuse();
        py::dict out;
        out["installed"] = s.installed;
        out["min_bytes"] = s.min_bytes;
        out["max_waste"] = s.max_waste;
        out["hits"] = s.hits;
        out["misses"] = s.misses;
        out["oversized"] = s.oversized;
        out["released"] = s.released;
        out["lent_bytes"] = s.lent_bytes;
        out["idle_bytes"] = s.idle_bytes;
        out["peak_bytes"] = s.peak_bytes;
        return out;
      },
      "what the reusing CPU allocator holds and has done (a dict; all zero before it is installed)");
  m.def("release_idle_cpu_memory", &morphpipe::release_idle_cpu_memory,
        "hands the reusing CPU allocator's idle blocks back to the system; returns the bytes released");

  py::class_<BufferPool, std::shared_ptr<BufferPool>>(
      m, "BufferPool", "the batchers' recycler of batch memory, on its own: its reuse rule can be checked directly")
      .def(py::init([](int64_t max_idle) {
             TORCH_CHECK(max_idle >= 0, "max_idle: need 0 or more idle buffers, got ", max_idle);
             return BufferPool::create(at::TensorOptions(), static_cast<size_t>(max_idle));
           }),
           py::arg("max_idle"))
      .def(
          "empty", [](BufferPool& self, int64_t nbytes) { return self.empty({nbytes}, at::kByte); },
          py::arg("nbytes"), "an uninitialised uint8 tensor of nbytes whose memory comes back to the pool")
      .def_property_readonly("held_bytes", &BufferPool::held_bytes);

  py::class_<FeatureStore, std::shared_ptr<FeatureStore>>(m, "FeatureStore")
      .def(py::init<std::string, int64_t, int64_t, int64_t, at::ScalarType, const at::Tensor&, int64_t, bool, bool,
                    const std::shared_ptr<FeatureStore>&>(),
           py::arg("path"), py::arg("data_offset"), py::arg("num_rows"), py::arg("width"), py::arg("dtype"),
           py::arg("cached_rows"), py::arg("io_threads"), py::arg("direct"), py::arg("io_uring"),
           py::arg("shares_io_with") = nullptr, py::call_guard<py::gil_scoped_release>(),
           "shares_io_with: a pread store with as many I/O threads whose pool this store reads through, or None")
      .def("shares_io_with", &FeatureStore::shares_io_with, py::arg("other"),
           "True when this store and other read through one pread pool")
      .def("pool_read_ns", &FeatureStore::pool_read_ns,
           "nanoseconds reads of this store or any sharing its pool were in flight (side by side counted once)")
      .def("reset_pool_read_ns", &FeatureStore::reset_pool_read_ns)
      .def("gather", &FeatureStore::gather, py::arg("ids"), py::call_guard<py::gil_scoped_release>())
      .def(
          "counters",
          [](const FeatureStore& self) {
            const morphpipe::FeatureStoreCounters c = self.counters();
            return py::make_tuple(c.hits, c.misses, c.reads, c.bytes_read, c.read_ns, c.read_gathers);
          },
          "(hits, misses, reads, bytes_read, read_ns, read_gathers) since the store opened or the last "
          "reset_counters")
      .def("count_reads", &FeatureStore::count_reads, py::arg("ids"), py::call_guard<py::gil_scoped_release>(),
           "(reads, bytes) the rows ids would take if none were cached; reads nothing")
      .def("reset_counters", &FeatureStore::reset_counters)
      .def_property_readonly("path", &FeatureStore::path)
      .def_property_readonly("num_rows", &FeatureStore::num_rows)
      .def_property_readonly("width", &FeatureStore::width)
      .def_property_readonly("dtype", &FeatureStore::dtype)
      .def_property_readonly("num_cached", &FeatureStore::num_cached)
      .def_property_readonly("io_threads", &FeatureStore::io_threads)
      .def_property_readonly("direct", &FeatureStore::direct)
      .def_property_readonly("io_uring", &FeatureStore::io_uring);

  py::class_<CpuBatcher>(m, "CpuBatcher")
      .def(py::init<at::Tensor, at::Tensor, std::optional<at::Tensor>, at::Tensor, std::vector<int64_t>, int64_t,
                    int64_t, bool, std::shared_ptr<FeatureStore>>(),
           py::arg("indptr"), py::arg("indices"), py::arg("features"), py::arg("labels"), py::arg("fanouts"),
           py::arg("num_threads"), py::arg("queue_size"), py::arg("pin_memory"), py::arg("feature_store") = nullptr,
           "features: the rows in RAM (or memory-mapped), or None to gather them through feature_store")
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
           py::arg("epoch_seed"), py::arg("first_batch") = 0, py::call_guard<py::gil_scoped_release>())
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
      .def_property_readonly("num_threads", &CpuBatcher::num_threads)
      .def_property_readonly("pool_bytes", &CpuBatcher::pool_bytes);

  py::class_<HeteroCpuBatcher>(m, "HeteroCpuBatcher")
      .def(py::init<std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>, std::vector<at::Tensor>,
                    std::vector<at::Tensor>, std::vector<std::optional<at::Tensor>>, at::Tensor,
                    std::vector<std::vector<int64_t>>, int64_t, int64_t, bool,
                    std::vector<std::shared_ptr<FeatureStore>>>(),
           py::arg("type_offsets"), py::arg("src_types"), py::arg("dst_types"), py::arg("indptrs"), py::arg("indices"),
           py::arg("features"), py::arg("labels"), py::arg("fanouts"), py::arg("num_threads"), py::arg("queue_size"),
           py::arg("pin_memory"), py::arg("feature_stores") = std::vector<std::shared_ptr<FeatureStore>>(),
           "features[t]: type t's rows in RAM (or memory-mapped), or None (no features, or rows on disk); "
           "feature_stores[t]: the store gathering type t's rows from disk, or None")
      .def("start_epoch", &HeteroCpuBatcher::start_epoch, py::arg("order"), py::arg("batch_size"),
           py::arg("drop_last"), py::arg("epoch_seed"), py::arg("first_batch") = 0,
           py::call_guard<py::gil_scoped_release>())
      .def(
          "next",
          [](HeteroCpuBatcher& self) {
            std::optional<HeteroCpuBatch> batch;
            {
              py::gil_scoped_release release;
              batch = self.next();
            }
            return hetero_batch_to_python(std::move(batch));
          },
          "(batch_index, seeds, nodes, indptrs, indices, counts, x, y, build_seconds) or None at epoch end")
      .def(
          "build",
          [](HeteroCpuBatcher& self, const at::Tensor& seeds, int64_t batch_index, int64_t epoch_seed) {
            std::optional<HeteroCpuBatch> batch;
            {
              py::gil_scoped_release release;
              batch = self.build(seeds, batch_index, epoch_seed);
            }
            return hetero_batch_to_python(std::move(batch));
          },
          py::arg("seeds"), py::arg("batch_index"), py::arg("epoch_seed"),
          "batch `batch_index` of `seeds` built on the calling thread, as an epoch with `epoch_seed` builds it")
      .def("stop", &HeteroCpuBatcher::stop, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("num_batches", &HeteroCpuBatcher::num_batches)
      .def_property_readonly("num_threads", &HeteroCpuBatcher::num_threads);
}
