#include "cpu/hetero_batcher.h"

#include <algorithm>
#include <cstring>

#include "common/hetero_sampler_checks.h"
#include "common/random.h"
#include "common/sampler_checks.h"
#include "cpu/feature_rows.h"

namespace morphpipe {

HeteroCpuBatcher::HeteroCpuBatcher(std::vector<int64_t> type_offsets, std::vector<int64_t> src_types,
                                   std::vector<int64_t> dst_types, std::vector<at::Tensor> indptrs,
                                   std::vector<at::Tensor> indices, std::vector<std::optional<at::Tensor>> features,
                                   at::Tensor labels, std::vector<std::vector<int64_t>> fanouts, int64_t num_threads,
                                   int64_t queue_size, bool pin_memory,
                                   std::vector<std::shared_ptr<FeatureStore>> feature_stores)
    : type_offsets_(std::move(type_offsets)),
      src_types_(std::move(src_types)),
      dst_types_(std::move(dst_types)),
      indptrs_(std::move(indptrs)),
      indices_(std::move(indices)),
      features_(std::move(features)),
      feature_stores_(std::move(feature_stores)),
      labels_(std::move(labels)),
      fanouts_(std::move(fanouts)),
      num_threads_(num_threads),
      window_(std::max<int64_t>(queue_size, 1)) {
  check_typed_topology(type_offsets_, src_types_, dst_types_, indptrs_, indices_);
  check_typed_fanouts(fanouts_, src_types_.size());
  TORCH_CHECK(num_threads_ >= 1, "num_threads: need at least 1 worker thread, got ", num_threads_);
  TORCH_CHECK(queue_size >= 1, "queue_size: need room for at least 1 batch, got ", queue_size);
  const size_t num_types = type_offsets_.size() - 1;
  TORCH_CHECK(features_.size() == num_types, "features: ", features_.size(), " entries for ", num_types,
              " node types; give one per type (None for a type without features)");
  TORCH_CHECK(feature_stores_.empty() || feature_stores_.size() == num_types, "feature_stores: ",
              feature_stores_.size(), " entries for ", num_types,
              " node types; give one per type (None where the type's rows are not on disk), or none");
  feature_stores_.resize(num_types);
  for (size_t t = 0; t < num_types; ++t) {
    const int64_t count = type_offsets_[t + 1] - type_offsets_[t];
    if (feature_stores_[t]) {
      TORCH_CHECK(!features_[t], "features of node type ", t, ": give the rows either as a features tensor or as ",
                  "a feature store, not both");
      TORCH_CHECK(feature_stores_[t]->num_rows() == count, "feature store of node type ", t, ": ",
                  feature_stores_[t]->num_rows(), " rows in ", feature_stores_[t]->path(), " for ", count,
                  " nodes; give one feature row per node");
      continue;
    }
    if (!features_[t]) continue;
    const at::Tensor& rows = *features_[t];
    TORCH_CHECK(rows.device().is_cpu() && rows.dim() == 2 && rows.is_contiguous(), "features of node type ", t,
                ": expected a contiguous 2-D CPU tensor, got shape ", rows.sizes());
    TORCH_CHECK(rows.size(0) == type_offsets_[t + 1] - type_offsets_[t], "features of node type ", t, ": ",
                rows.size(0), " rows for ", type_offsets_[t + 1] - type_offsets_[t], " nodes; give one row per node");
  }
  TORCH_CHECK(labels_.device().is_cpu() && labels_.dim() == 1 && labels_.scalar_type() == at::kLong &&
                  labels_.is_contiguous() && labels_.numel() == type_offsets_.back(),
              "labels: expected a contiguous 1-D int64 CPU tensor with one label per node (", type_offsets_.back(), ")");
  const size_t tensors_per_batch = 2 * fanouts_.size() * src_types_.size() + 3 * num_types + 2;
  const size_t batches_held = static_cast<size_t>(queue_size + num_threads_ + 2);
  pool_ = BufferPool::create(at::TensorOptions().pinned_memory(pin_memory), tensors_per_batch * batches_held);
}

std::shared_ptr<HeteroNeighborSampler> HeteroCpuBatcher::make_sampler() const {
  return std::make_shared<HeteroNeighborSampler>(type_offsets_, src_types_, dst_types_, indptrs_, indices_, fanouts_);
}

void HeteroCpuBatcher::start_epoch(const at::Tensor& order, int64_t batch_size, bool drop_last, int64_t epoch_seed,
                                   int64_t first_batch) {
  stop();
  const int64_t num_batches = epoch_batch_count(order, batch_size, drop_last);
  check_first_batch(first_batch, num_batches);
  order_ = order.contiguous();
  batch_size_ = batch_size;
  epoch_seed_ = splitmix64(static_cast<uint64_t>(epoch_seed));
  window_.start(num_batches, num_threads_, [this]() -> OrderedWindow<HeteroCpuBatch>::Builder {
    auto sampler = make_sampler();
    return [this, sampler](int64_t batch_index) {
      const int64_t begin = batch_index * batch_size_;
      const int64_t count = std::min(batch_size_, order_.numel() - begin);
      return build_batch(*sampler, order_.data_ptr<int64_t>() + begin, count, batch_index, epoch_seed_);
    };
  }, first_batch);
}

HeteroCpuBatch HeteroCpuBatcher::build(const at::Tensor& seeds, int64_t batch_index, int64_t epoch_seed) {
  TORCH_CHECK(seeds.dim() == 1 && seeds.scalar_type() == at::kLong,
              "seeds: expected a 1-D int64 tensor of node ids, got ", seeds.scalar_type());
  const at::Tensor contiguous = seeds.contiguous();
  auto sampler = make_sampler();
  return build_batch(*sampler, contiguous.data_ptr<int64_t>(), contiguous.numel(), batch_index,
                     splitmix64(static_cast<uint64_t>(epoch_seed)));
}

HeteroCpuBatch HeteroCpuBatcher::build_batch(HeteroNeighborSampler& sampler, const int64_t* seeds, int64_t count,
                                             int64_t batch_index, uint64_t mixed_epoch_seed) {
  HeteroCpuBatch batch;
  batch.batch_index = batch_index;
  batch.seeds = pool_->empty({count}, at::kLong);
  std::memcpy(batch.seeds.data_ptr<int64_t>(), seeds, count * sizeof(int64_t));
  SampledTypedBlocks blocks =
      sampler.sample(seeds, count, splitmix64(mixed_epoch_seed ^ static_cast<uint64_t>(batch_index)), *pool_);
  batch.indptrs = std::move(blocks.indptrs);
  batch.indices = std::move(blocks.indices);
  batch.counts = std::move(blocks.counts);
  const size_t num_types = type_offsets_.size() - 1;
  batch.x.resize(num_types);
  for (size_t t = 0; t < num_types; ++t) {
    const at::Tensor& nodes = blocks.nodes[t];
    const int64_t num = nodes.numel();
    at::Tensor local = pool_->empty({num}, at::kLong);
    const int64_t* global = nodes.data_ptr<int64_t>();
    int64_t* out = local.data_ptr<int64_t>();
    const int64_t start = type_offsets_[t];
    for (int64_t i = 0; i < num; ++i) out[i] = global[i] - start;
    if (features_[t] || feature_stores_[t]) {
      batch.x[t] = gather_feature_rows(features_[t].value_or(at::Tensor()), feature_stores_[t].get(), out, num, *pool_);
    } else {
      batch.x[t] = std::move(local);
    }
  }
  batch.input_nodes = std::move(blocks.input_nodes);
  batch.y = pool_->empty({count}, at::kLong);
  const int64_t* labels = labels_.data_ptr<int64_t>();
  int64_t* y = batch.y.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) y[i] = labels[seeds[i]];
  return batch;
}

}  // namespace morphpipe
