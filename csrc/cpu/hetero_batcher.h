// Route 0 batcher for heterogeneous graphs: worker threads build whole typed mini-batches (typed sampling,
// per-type relabelling, per-type feature gathering, labels) outside the GIL, handed over in batch order
// through the same bounded window as CpuBatcher's.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "cpu/buffer_pool.h"
#include "cpu/feature_store.h"
#include "cpu/hetero_sampler.h"
#include "cpu/ordered_window.h"

namespace morphpipe {

// One finished typed mini-batch; layers are input layer first.
struct HeteroCpuBatch {
  int64_t batch_index = -1;
  at::Tensor seeds;
  at::Tensor input_nodes;                        // global ids of the input layer's sources, type after type
  std::vector<std::vector<at::Tensor>> indptrs;  // [layer][relation]
  std::vector<std::vector<at::Tensor>> indices;  // [layer][relation]
  std::vector<std::vector<int64_t>> counts;      // [layer + 1][type]
  std::vector<at::Tensor> x;  // per type: gathered feature rows (from RAM or disk), or local ids (int64) for a type
                              // without features
  at::Tensor y;
  double build_seconds = 0.0;
};

class HeteroCpuBatcher {
 public:
  // features[t]: [count of type t, F_t] contiguous CPU rows, or std::nullopt for a type without features or one
  // whose rows are on disk: feature_stores[t] (empty, or one per type, null where the rows are not on disk)
  // gathers those, as CpuBatcher's feature_store does.
  HeteroCpuBatcher(std::vector<int64_t> type_offsets, std::vector<int64_t> src_types, std::vector<int64_t> dst_types,
                   std::vector<at::Tensor> indptrs, std::vector<at::Tensor> indices,
                   std::vector<std::optional<at::Tensor>> features, at::Tensor labels,
                   std::vector<std::vector<int64_t>> fanouts, int64_t num_threads, int64_t queue_size, bool pin_memory,
                   std::vector<std::shared_ptr<FeatureStore>> feature_stores = {});
  ~HeteroCpuBatcher() { stop(); }
  HeteroCpuBatcher(const HeteroCpuBatcher&) = delete;
  HeteroCpuBatcher& operator=(const HeteroCpuBatcher&) = delete;

  // As CpuBatcher::start_epoch: `order` cut into batches of `batch_size`, `epoch_seed` fixes every choice,
  // batches before `first_batch` skipped.
  void start_epoch(const at::Tensor& order, int64_t batch_size, bool drop_last, int64_t epoch_seed,
                   int64_t first_batch = 0);
  std::optional<HeteroCpuBatch> next() { return window_.next(); }
  void stop() { window_.stop(); }

  // Builds batch `batch_index` of seeds `seeds` on the calling thread, exactly as a worker of an epoch with
  // `epoch_seed` would (the serial path).
  HeteroCpuBatch build(const at::Tensor& seeds, int64_t batch_index, int64_t epoch_seed);

  int64_t num_batches() const { return window_.num_batches(); }
  int64_t num_threads() const { return num_threads_; }

 private:
  HeteroCpuBatch build_batch(HeteroNeighborSampler& sampler, const int64_t* seeds, int64_t count,
                             int64_t batch_index, uint64_t mixed_epoch_seed);
  std::shared_ptr<HeteroNeighborSampler> make_sampler() const;

  std::vector<int64_t> type_offsets_, src_types_, dst_types_;
  std::vector<at::Tensor> indptrs_, indices_;
  std::vector<std::optional<at::Tensor>> features_;
  std::vector<std::shared_ptr<FeatureStore>> feature_stores_;  // per type; null where features_ holds the rows
  at::Tensor labels_;
  std::vector<std::vector<int64_t>> fanouts_;
  int64_t num_threads_;
  std::shared_ptr<BufferPool> pool_;

  at::Tensor order_;
  int64_t batch_size_ = 0;
  uint64_t epoch_seed_ = 0;
  OrderedWindow<HeteroCpuBatch> window_;
};

}  // namespace morphpipe
