// Recycles the memory of batch outputs. A batch's tensors are views of pooled buffers whose
// deleter returns the buffer when the consumer drops the tensor, so a steady stream of
// batches stops paying for fresh pages (first-touch faults cost more than the gather itself).
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

namespace morphpipe {

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  // `options` decides where buffers live (e.g. pinned host memory); at most `max_idle`
  // returned buffers are kept; 0 makes the pool a plain allocator.
  static std::shared_ptr<BufferPool> create(at::TensorOptions options, size_t max_idle) {
    return std::shared_ptr<BufferPool>(new BufferPool(options, max_idle));
  }

  // An uninitialised contiguous tensor whose memory comes back to this pool when it dies.
  at::Tensor empty(at::IntArrayRef sizes, at::ScalarType dtype);

  // Bytes of the buffers this pool made that are alive, lent out or idle: what the pool holds.
  int64_t held_bytes() const { return held_bytes_.load(); }

 private:
  BufferPool(at::TensorOptions options, size_t max_idle) : options_(options), max_idle_(max_idle) {}
  void give_back(at::Tensor buffer);

  at::TensorOptions options_;
  size_t max_idle_;
  std::mutex mutex_;
  std::vector<at::Tensor> idle_;  // uint8 buffers not in use
  std::atomic<int64_t> held_bytes_{0};
};

}  // namespace morphpipe
