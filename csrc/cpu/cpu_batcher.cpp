#include "cpu/cpu_batcher.h"

#include <algorithm>
#include <cstring>

#include "common/edge_batch_checks.h"
#include "common/random.h"
#include "common/sampler_checks.h"
#include "cpu/feature_rows.h"
#include "cpu/neighbor_sampler.h"

namespace morphpipe {

CpuBatcher::CpuBatcher(at::Tensor indptr, at::Tensor indices, std::optional<at::Tensor> features, at::Tensor labels,
                       std::vector<int64_t> fanouts, int64_t num_threads, int64_t queue_size, bool pin_memory,
                       std::shared_ptr<FeatureStore> feature_store)
    : indptr_(std::move(indptr)),
      indices_(std::move(indices)),
      features_(features.value_or(at::Tensor())),
      labels_(std::move(labels)),
      feature_store_(std::move(feature_store)),
      fanouts_(std::move(fanouts)),
      num_threads_(num_threads),
      queue_size_(queue_size),
      window_(std::max<int64_t>(queue_size, 1)) {
  check_cpu_topology(indptr_, indices_);
  check_fanouts(fanouts_);
  const int64_t num_nodes = indptr_.numel() - 1;
  TORCH_CHECK(num_threads_ >= 1, "num_threads: need at least 1 worker thread, got ", num_threads_);
  TORCH_CHECK(queue_size_ >= 1, "queue_size: need room for at least 1 batch, got ", queue_size_);
  TORCH_CHECK(features_.defined() != (feature_store_ != nullptr),
              "CpuBatcher: give the feature rows either as a features tensor or as a feature_store, exactly one");
  if (feature_store_) {
    TORCH_CHECK(feature_store_->num_rows() == num_nodes, "feature_store: ", feature_store_->num_rows(),
                " rows in ", feature_store_->path(), " for ", num_nodes, " nodes; give one feature row per node");
  } else {
    TORCH_CHECK(features_.device().is_cpu() && features_.dim() == 2 && features_.is_contiguous(),
                "features: expected a contiguous 2-D CPU tensor, got shape ", features_.sizes());
    TORCH_CHECK(features_.size(0) == num_nodes, "features: ", features_.size(0), " rows for ", num_nodes,
                " nodes; give one feature row per node");
  }
  TORCH_CHECK(labels_.device().is_cpu() && labels_.dim() == 1 && labels_.scalar_type() == at::kLong &&
                  labels_.is_contiguous(),
              "labels: expected a contiguous 1-D int64 CPU tensor");
  TORCH_CHECK(labels_.numel() == num_nodes, "labels: ", labels_.numel(), " labels for ", num_nodes,
              " nodes; give one label per node");
  // Enough idle buffers for every tensor of every batch in flight or in the consumer's hands.
  const size_t tensors_per_batch = 2 * fanouts_.size() + 8;
  const size_t batches_held = static_cast<size_t>(queue_size_ + num_threads_ + 2);
  pool_ = BufferPool::create(at::TensorOptions().pinned_memory(pin_memory), tensors_per_batch * batches_held);
}

CpuBatcher::~CpuBatcher() { stop(); }

void CpuBatcher::start_epoch(const at::Tensor& order, int64_t batch_size, bool drop_last, int64_t epoch_seed,
                             int64_t first_batch) {
  stop();
  const int64_t num_batches = epoch_batch_count(order, batch_size, drop_last);
  check_first_batch(first_batch, num_batches);
  order_ = order.contiguous();
  batch_size_ = batch_size;
  epoch_seed_ = splitmix64(static_cast<uint64_t>(epoch_seed));
  window_.start(num_batches, num_threads_, [this]() -> OrderedWindow<CpuBatch>::Builder {
    if (edge_task_) {
      auto edges = std::make_shared<EdgeBatchBuilder>(*edge_task_, indptr_, indices_, fanouts_);
      return [this, edges](int64_t batch_index) { return build_edge_batch(*edges, batch_index); };
    }
    auto sampler = std::make_shared<NeighborSampler>(indptr_, indices_, fanouts_);
    return [this, sampler](int64_t batch_index) { return build_batch(*sampler, batch_index); };
  }, first_batch);
}

void CpuBatcher::set_edge_task(EdgeTask task) {
  stop();
  check_edge_task(task.pair_src, task.pair_dst, task.num_negatives, task.negative_cdf, indptr_.numel() - 1);
  edge_task_ = std::move(task);
}

uint64_t CpuBatcher::batch_seed(int64_t batch_index) const {
  return splitmix64(epoch_seed_ ^ static_cast<uint64_t>(batch_index));
}

at::Tensor CpuBatcher::gather_features(const at::Tensor& input_nodes) {
  return gather_feature_rows(features_, feature_store_.get(), input_nodes.data_ptr<int64_t>(), input_nodes.numel(),
                             *pool_);
}

CpuBatch CpuBatcher::build_edge_batch(EdgeBatchBuilder& builder, int64_t batch_index) {
  const int64_t begin = batch_index * batch_size_;
  const int64_t count = std::min(batch_size_, order_.numel() - begin);
  EdgeSample sample = builder.build(order_.data_ptr<int64_t>() + begin, count, batch_seed(batch_index), *pool_);
  CpuBatch batch;
  batch.batch_index = batch_index;
  batch.seeds = std::move(sample.seeds);
  batch.input_nodes = std::move(sample.blocks.input_nodes);
  batch.block_indptrs = std::move(sample.blocks.block_indptrs);
  batch.block_indices = std::move(sample.blocks.block_indices);
  batch.x = gather_features(batch.input_nodes);
  batch.y = pool_->empty({0}, at::kLong);
  batch.edge_ids = std::move(sample.edge_ids);
  batch.pair_src = std::move(sample.src);
  batch.pair_dst = std::move(sample.dst);
  batch.negative_dst = std::move(sample.negative_dst);
  return batch;
}

CpuBatch CpuBatcher::build_batch(NeighborSampler& sampler, int64_t batch_index) {
  const int64_t begin = batch_index * batch_size_;
  const int64_t count = std::min(batch_size_, order_.numel() - begin);
  CpuBatch batch;
  batch.batch_index = batch_index;
  batch.seeds = pool_->empty({count}, at::kLong);
  const int64_t* seeds = order_.data_ptr<int64_t>() + begin;
  std::memcpy(batch.seeds.data_ptr<int64_t>(), seeds, count * sizeof(int64_t));

  SampledBlocks blocks = sampler.sample(seeds, count, batch_seed(batch_index), *pool_);
  batch.input_nodes = std::move(blocks.input_nodes);
  batch.block_indptrs = std::move(blocks.block_indptrs);
  batch.block_indices = std::move(blocks.block_indices);

  batch.x = gather_features(batch.input_nodes);

  batch.y = pool_->empty({count}, at::kLong);
  const int64_t* labels = labels_.data_ptr<int64_t>();
  int64_t* y = batch.y.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) y[i] = labels[seeds[i]];
  return batch;
}

}  // namespace morphpipe
