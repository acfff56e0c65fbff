// Route 0 batcher (SALIENT-style batch-level parallelism): each worker thread builds whole
// mini-batches (sample, relabel, gather features and labels) outside the GIL, and a bounded
// window of batches in flight is handed to the consumer in batch order.
#pragma once

#include <ATen/ATen.h>

#include "cpu/buffer_pool.h"
#include "cpu/feature_store.h"
#include "cpu/ordered_window.h"
#include "cpu/edge_batch.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace morphpipe {

// One finished mini-batch; blocks are input layer first.
struct CpuBatch {
  int64_t batch_index = -1;
  at::Tensor seeds;
  at::Tensor input_nodes;
  std::vector<at::Tensor> block_indptrs;
  std::vector<at::Tensor> block_indices;
  at::Tensor x;
  at::Tensor y;  // node task: labels of the seeds; edge task: empty
  // Edge task only (undefined otherwise): the positives' edge ids, their endpoints and negatives in local ids.
  at::Tensor edge_ids, pair_src, pair_dst, negative_dst;
  double build_seconds = 0.0;  // wall time one worker spent building it (re-planning measures T_CB)
};

class CpuBatcher {
 public:
  // Feature rows come from `features` (in RAM or memory-mapped) or, when it is absent, from `feature_store`.
  CpuBatcher(at::Tensor indptr, at::Tensor indices, std::optional<at::Tensor> features, at::Tensor labels,
             std::vector<int64_t> fanouts, int64_t num_threads, int64_t queue_size, bool pin_memory,
             std::shared_ptr<FeatureStore> feature_store = nullptr);
  ~CpuBatcher();
  CpuBatcher(const CpuBatcher&) = delete;
  CpuBatcher& operator=(const CpuBatcher&) = delete;

  // Makes this an edge-task batcher: `order` then holds training edge ids, and each batch is an edge batch
  // (EdgeBatchBuilder) with its features gathered. Stops any epoch in progress.
  void set_edge_task(EdgeTask task);

  // Starts producing the batches of one epoch: `order` (int64 seed ids, already shuffled)
  // is cut into consecutive batches of `batch_size`; `epoch_seed` fixes all random choices.
  // Any epoch still running is stopped first. Batches before `first_batch` are skipped (a resumed epoch): the
  // others are the same as in a full epoch.
  void start_epoch(const at::Tensor& order, int64_t batch_size, bool drop_last, int64_t epoch_seed,
                   int64_t first_batch = 0);

  // Blocks until the next batch in order is ready; std::nullopt once the epoch is exhausted.
  // Re-throws, on the caller's thread, the first exception raised by any worker.
  std::optional<CpuBatch> next() { return window_.next(); }

  // Stops the workers and drops batches not yet consumed.
  void stop() { window_.stop(); }

  int64_t num_batches() const { return window_.num_batches(); }
  int64_t num_threads() const { return num_threads_; }
  // Bytes the batch buffer pool holds (batches lent out and idle buffers): flat from epoch to epoch.
  int64_t pool_bytes() const { return pool_->held_bytes(); }

 private:
  CpuBatch build_batch(class NeighborSampler& sampler, int64_t batch_index);
  CpuBatch build_edge_batch(EdgeBatchBuilder& builder, int64_t batch_index);
  // The feature rows of `input_nodes`, from RAM (or a memory map) or through the feature store.
  at::Tensor gather_features(const at::Tensor& input_nodes);
  uint64_t batch_seed(int64_t batch_index) const;

  at::Tensor indptr_, indices_, features_, labels_;
  std::shared_ptr<FeatureStore> feature_store_;  // null when features_ holds the rows
  std::vector<int64_t> fanouts_;
  std::optional<EdgeTask> edge_task_;
  int64_t num_threads_;
  int64_t queue_size_;
  std::shared_ptr<BufferPool> pool_;  // memory of batch outputs, recycled

  at::Tensor order_;
  int64_t batch_size_ = 0;
  uint64_t epoch_seed_ = 0;
  OrderedWindow<CpuBatch> window_;
};

}  // namespace morphpipe
