#include "cpu/buffer_pool.h"

#include <algorithm>

namespace morphpipe {
namespace {

// An idle buffer serves a request of at least 1/kMaxSlack of its size (any request, below kSmallBytes).
constexpr int64_t kMaxSlack = 2;
constexpr int64_t kSmallBytes = 64 * 1024;

}  // namespace

at::Tensor BufferPool::empty(at::IntArrayRef sizes, at::ScalarType dtype) {
  if (max_idle_ == 0) return at::empty(sizes, options_.dtype(dtype));
  int64_t bytes = static_cast<int64_t>(c10::elementSize(dtype));
  for (const int64_t size : sizes) bytes *= size;
  at::Tensor buffer;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Smallest idle buffer that fits and is at most kMaxSlack times the request. Without that bound a
    // small tensor takes a large idle buffer, the next large request finds none and allocates another,
    // and epoch after epoch every buffer in circulation drifts to the largest size ever asked for.
    auto best = idle_.end();
    for (auto it = idle_.begin(); it != idle_.end(); ++it) {
      if (it->numel() >= bytes && it->numel() <= std::max<int64_t>(bytes * kMaxSlack, kSmallBytes) &&
          (best == idle_.end() || it->numel() < best->numel()))
        best = it;
    }
    if (best != idle_.end()) {
      buffer = std::move(*best);
      idle_.erase(best);
    }
  }
  if (!buffer.defined()) {
    // Headroom so that the next, slightly larger batch can reuse this buffer.
    buffer = at::empty({std::max<int64_t>(bytes + bytes / 4, 64)}, options_.dtype(at::kByte));
    held_bytes_ += buffer.numel();
  }
  void* data = buffer.data_ptr();
  std::shared_ptr<BufferPool> self = shared_from_this();
  return at::from_blob(
      data, sizes, [self, buffer](void*) mutable { self->give_back(std::move(buffer)); },
      at::TensorOptions().dtype(dtype));
}

void BufferPool::give_back(at::Tensor buffer) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (idle_.size() < max_idle_) {
    idle_.push_back(std::move(buffer));
  } else {
    // Keep the larger buffers: a pool that only holds small ones stops helping.
    auto smallest = std::min_element(idle_.begin(), idle_.end(),
                                     [](const at::Tensor& a, const at::Tensor& b) { return a.numel() < b.numel(); });
    if (smallest != idle_.end() && smallest->numel() < buffer.numel()) std::swap(*smallest, buffer);
    held_bytes_ -= buffer.numel();  // the one not kept is freed when `buffer` goes
  }
}

}  // namespace morphpipe
