// Edge mini-batches (EdgeBatchBuilder, behind the CpuBatcher's edge task) and the op `morphpipe::sample_edge_batch`,
// which builds one on the calling thread with the same random choices as the CpuBatcher for the same seed.
#include "cpu/edge_batch.h"

#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/edge_batch_checks.h"
#include "common/random.h"
#include "common/sampler_checks.h"

namespace morphpipe {

namespace {

// A negative that is an edge is redrawn at most this often; a source adjacent to nearly every node exhausts it.
constexpr int kMaxNegativeDraws = 64;

// Uniform double in [0, 1) from 53 random bits.
double unit_draw(Xoshiro256& rng) { return static_cast<double>(rng.next() >> 11) * 0x1.0p-53; }

}  // namespace

EdgeBatchBuilder::EdgeBatchBuilder(const EdgeTask& task, at::Tensor indptr, at::Tensor indices,
                                   std::vector<int64_t> fanouts)
    : task_(task),
      indptr_(indptr),
      indices_(indices),
      num_nodes_(indptr.numel() - 1),
      sampler_(std::move(indptr), std::move(indices), std::move(fanouts)) {
  check_edge_task(task_.pair_src, task_.pair_dst, task_.num_negatives, task_.negative_cdf, num_nodes_);
}

int64_t EdgeBatchBuilder::seed_id(int64_t node) {
  bool inserted;
  const int64_t local = seed_map_.insert(node, static_cast<int64_t>(seeds_.size()), inserted);
  if (inserted) seeds_.push_back(node);
  return local;
}

bool EdgeBatchBuilder::is_edge(int64_t src, int64_t dst) const {
  const int64_t begin = indptr_.data_ptr<int64_t>()[dst];
  const int64_t end = indptr_.data_ptr<int64_t>()[dst + 1];
  if (indices_.scalar_type() == at::kInt) {
    const int32_t* list = indices_.data_ptr<int32_t>();
    return std::find(list + begin, list + end, static_cast<int32_t>(src)) != list + end;
  }
  const int64_t* list = indices_.data_ptr<int64_t>();
  return std::find(list + begin, list + end, src) != list + end;
}

int64_t EdgeBatchBuilder::draw_negative(int64_t source, Xoshiro256& rng) {
  const bool weighted = task_.negative_cdf.defined() && task_.negative_cdf.numel() > 0;
  for (int attempt = 0; attempt < kMaxNegativeDraws; ++attempt) {
    int64_t node;
    if (weighted) {
      const double* cdf = task_.negative_cdf.data_ptr<double>();
      const double target = unit_draw(rng) * cdf[num_nodes_ - 1];
      node = std::min<int64_t>(std::upper_bound(cdf, cdf + num_nodes_, target) - cdf, num_nodes_ - 1);
    } else {
      node = static_cast<int64_t>(rng.below(static_cast<uint64_t>(num_nodes_)));
    }
    if (!task_.reject_positives || (node != source && !is_edge(source, node))) return node;
  }
  TORCH_CHECK(false, "negative sampling: node ", source, " is joined to nearly every node it could be corrupted to; "
              "no non-edge destination was found in ", kMaxNegativeDraws, " draws; sample negatives without "
              "rejecting positives (reject_positives=False)");
}

EdgeSample EdgeBatchBuilder::build(const int64_t* edge_ids, int64_t count, uint64_t rng_seed, BufferPool& pool) {
  Xoshiro256 rng(rng_seed);
  const int64_t num_pairs = task_.pair_src.numel();
  const int64_t* pair_src = task_.pair_src.data_ptr<int64_t>();
  const int64_t* pair_dst = task_.pair_dst.data_ptr<int64_t>();
  const int64_t k = task_.num_negatives;
  seed_map_.clear();
  seeds_.clear();
  seed_map_.reserve(count * (2 + k));
  exclusion_.reset(num_nodes_);

  EdgeSample sample;
  sample.edge_ids = pool.empty({count}, at::kLong);
  sample.src = pool.empty({count}, at::kLong);
  sample.dst = pool.empty({count}, at::kLong);
  sample.negative_dst = pool.empty({count, k}, at::kLong);
  int64_t* ids = sample.edge_ids.data_ptr<int64_t>();
  int64_t* src = sample.src.data_ptr<int64_t>();
  int64_t* dst = sample.dst.data_ptr<int64_t>();
  int64_t* negatives = sample.negative_dst.data_ptr<int64_t>();
  std::vector<int64_t> sources(count);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t edge = edge_ids[i];
    check_edge_id(i, edge, num_pairs);
    const int64_t u = pair_src[edge];
    const int64_t v = pair_dst[edge];
    check_pair_node("pair_src", edge, u, num_nodes_);
    check_pair_node("pair_dst", edge, v, num_nodes_);
    ids[i] = edge;
    src[i] = seed_id(u);
    dst[i] = seed_id(v);
    sources[i] = u;
    if (task_.exclude) {
      exclusion_.add(u, v);
      if (task_.undirected) exclusion_.add(v, u);
    }
  }
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t j = 0; j < k; ++j) negatives[i * k + j] = seed_id(draw_negative(sources[i], rng));
  }
  sample.seeds = pool.empty({static_cast<int64_t>(seeds_.size())}, at::kLong);
  std::memcpy(sample.seeds.data_ptr<int64_t>(), seeds_.data(), seeds_.size() * sizeof(int64_t));
  sample.blocks = sampler_.sample(seeds_.data(), static_cast<int64_t>(seeds_.size()), rng.next(), pool,
                                  task_.exclude ? &exclusion_ : nullptr);
  return sample;
}

namespace {

// Op `morphpipe::sample_edge_batch`: one edge batch on the calling thread.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, std::vector<at::Tensor>,
           std::vector<at::Tensor>>
sample_edge_batch_cpu(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& pair_src,
                      const at::Tensor& pair_dst, const at::Tensor& edge_ids, at::IntArrayRef fanouts,
                      int64_t num_negatives, const std::optional<at::Tensor>& negative_cdf, bool exclude,
                      bool undirected, bool reject_positives, int64_t seed) {
  TORCH_CHECK(edge_ids.dim() == 1 && edge_ids.scalar_type() == at::kLong,
              "morphpipe::sample_edge_batch: edge_ids must be a 1-D int64 tensor, got ", edge_ids.scalar_type(),
              " of shape ", edge_ids.sizes());
  check_cpu_topology(indptr, indices);
  EdgeTask task{pair_src.contiguous(), pair_dst.contiguous(), num_negatives,
                negative_cdf.has_value() ? negative_cdf->contiguous() : at::Tensor(), exclude, undirected,
                reject_positives};
  EdgeBatchBuilder builder(task, indptr.contiguous(), indices.contiguous(), fanouts.vec());
  auto allocator = BufferPool::create(at::TensorOptions(), /*max_idle=*/0);
  const at::Tensor ids = edge_ids.contiguous();
  EdgeSample sample = builder.build(ids.data_ptr<int64_t>(), ids.numel(), splitmix64(static_cast<uint64_t>(seed)),
                                    *allocator);
  return {sample.seeds, sample.src, sample.dst, sample.negative_dst, sample.blocks.input_nodes,
          sample.blocks.block_indptrs, sample.blocks.block_indices};
}

}  // namespace

TORCH_LIBRARY_IMPL(morphpipe, CPU, m) {
  m.impl("sample_edge_batch", &sample_edge_batch_cpu);
}

}  // namespace morphpipe
