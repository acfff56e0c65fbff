// A bounded window of batches built by worker threads and handed to one consumer in batch order: what
// the Route 0 batchers (CpuBatcher, HeteroCpuBatcher) share. Each worker claims the next batch index,
// builds it outside any lock with its own per-thread state, and parks it in slot index % queue_size;
// a worker waits while the window is full, the consumer while the next batch is not ready.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <c10/util/Exception.h>

namespace morphpipe {

// `Batch` has a `double build_seconds` member, set here to the time one worker spent building it.
template <typename Batch>
class OrderedWindow {
 public:
  using Builder = std::function<Batch(int64_t batch_index)>;
  // Called once on every worker thread: that thread's builder (e.g. over its own sampler workspace).
  using MakeBuilder = std::function<Builder()>;

  explicit OrderedWindow(int64_t queue_size) : queue_size_(queue_size), window_(queue_size) {}
  ~OrderedWindow() { stop(); }
  OrderedWindow(const OrderedWindow&) = delete;
  OrderedWindow& operator=(const OrderedWindow&) = delete;

  // Starts `num_threads` workers over batches [first_batch, num_batches) (a resumed epoch skips the batches it
  // already trained); call stop() first if a run is in progress.
  void start(int64_t num_batches, int64_t num_threads, MakeBuilder make_builder, int64_t first_batch = 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    num_batches_ = num_batches;
    next_to_claim_ = first_batch;
    next_to_deliver_ = first_batch;
    for (auto& slot : window_) slot.reset();
    error_ = nullptr;
    stopping_ = false;
    const int64_t useful_threads = std::min(num_threads, std::max<int64_t>(num_batches - first_batch, 1));
    for (int64_t t = 0; t < useful_threads; ++t) workers_.emplace_back(&OrderedWindow::worker_loop, this, make_builder);
  }

  // Blocks until the next batch in order is ready; std::nullopt once every batch was delivered.
  // Re-throws, on the caller's thread, the first exception raised by any worker.
  std::optional<Batch> next() {
    std::optional<Batch> batch;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (next_to_deliver_ >= num_batches_) return std::nullopt;
      auto& slot = window_[next_to_deliver_ % queue_size_];
      batch_ready_.wait(lock, [&] { return error_ || stopping_ || slot.has_value(); });
      if (error_) {
        std::exception_ptr error = error_;
        lock.unlock();
        stop();
        std::rethrow_exception(error);
      }
      TORCH_CHECK(slot.has_value(), "the epoch was stopped; start a new epoch");
      batch = std::move(slot);
      slot.reset();
      ++next_to_deliver_;
    }
    window_open_.notify_all();
    return batch;
  }

  // Stops the workers and drops batches not yet consumed.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    window_open_.notify_all();
    batch_ready_.notify_all();
    for (auto& worker : workers_) worker.join();
    workers_.clear();
  }

  int64_t num_batches() const { return num_batches_; }

 private:
  void worker_loop(const MakeBuilder& make_builder) {
    Builder build;
    try {
      build = make_builder();
    } catch (...) {
      fail();
      return;
    }
    while (true) {
      int64_t batch_index;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        window_open_.wait(lock, [&] {
          return stopping_ || next_to_claim_ >= num_batches_ || next_to_claim_ < next_to_deliver_ + queue_size_;
        });
        if (stopping_ || next_to_claim_ >= num_batches_) return;
        batch_index = next_to_claim_++;
      }
      try {
        const auto started = std::chrono::steady_clock::now();
        Batch batch = build(batch_index);
        batch.build_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
        std::lock_guard<std::mutex> lock(mutex_);
        window_[batch_index % queue_size_] = std::move(batch);
      } catch (...) {
        fail();
      }
      batch_ready_.notify_all();
    }
  }

  // Records the current exception for the consumer and stops every worker.
  void fail() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
      stopping_ = true;
    }
    window_open_.notify_all();
    batch_ready_.notify_all();
  }

  int64_t queue_size_;
  int64_t num_batches_ = 0;
  std::mutex mutex_;
  std::condition_variable window_open_;  // workers wait for room in the window
  std::condition_variable batch_ready_;  // the consumer waits for the next batch
  int64_t next_to_claim_ = 0;
  int64_t next_to_deliver_ = 0;
  std::vector<std::optional<Batch>> window_;  // slot batch_index % queue_size
  std::exception_ptr error_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace morphpipe
