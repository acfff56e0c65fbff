// A batcher's feature gather: rows from a tensor in RAM (or memory-mapped), or from the feature file through a
// FeatureStore (hot rows cached, the rest read); one helper for the homogeneous and the typed batchers.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "cpu/buffer_pool.h"
#include "cpu/feature_store.h"
#include "cpu/gather_rows.h"

namespace morphpipe {

// Rows ids[0..count) as a new [count, width] tensor from `pool`: through `store` when it is given, else from the
// contiguous 2-D `rows`. The ids must be in range (a sampler's are).
inline at::Tensor gather_feature_rows(const at::Tensor& rows, FeatureStore* store, const int64_t* ids, int64_t count,
                                      BufferPool& pool) {
  if (store != nullptr) {
    at::Tensor x = pool.empty({count, store->width()}, store->dtype());
    store->gather_into(ids, count, x);
    return x;
  }
  at::Tensor x = pool.empty({count, rows.size(1)}, rows.scalar_type());
  gather_rows_into(rows, ids, count, x, /*stream=*/true);  // the pool recycles x: its lines are not cached
  return x;
}

}  // namespace morphpipe
