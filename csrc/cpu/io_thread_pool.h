// Threads that keep many blocking reads in flight: a job of `count` independent tasks is spread over the
// pool's threads and the calling thread, so a disk sees about (threads + callers) requests at once.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <sys/types.h>

#include <thread>
#include <vector>

namespace morphpipe {

class IoThreadPool {
 public:
  explicit IoThreadPool(int64_t num_threads);
  ~IoThreadPool();
  IoThreadPool(const IoThreadPool&) = delete;
  IoThreadPool& operator=(const IoThreadPool&) = delete;

  // Runs task(0) .. task(count - 1), in any order and on any thread (the caller's included), and returns once all
  // ran; re-throws the first exception a task raised. Several callers may run jobs at once.
  void run(int64_t count, const std::function<void(int64_t)>& task);

  int64_t num_threads() const { return static_cast<int64_t>(threads_.size()); }

 private:
  struct Job {
    const std::function<void(int64_t)>* task;
    int64_t count;
    std::atomic<int64_t> next_task{0};
    int64_t finished = 0;  // under mutex
    std::exception_ptr error;
    std::mutex mutex;
    std::condition_variable all_finished;
  };

  void thread_loop();
  // Claims and runs tasks of `job` until none is left unclaimed; false when there was none to claim.
  static bool work_on(Job& job);

  std::mutex mutex_;
  std::condition_variable work_available_;
  std::deque<std::shared_ptr<Job>> jobs_;  // jobs with tasks not yet claimed (front first)
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// Wall time with reads in flight: gathers reading side by side counted once, one clock read per gather that reads
// (not per row); `begin` when a gather starts reading, `end` when it is done (also when a read failed).
class ReadingTimer {
 public:
  void begin();
  void end();
  // Nanoseconds with reads in flight since the timer started or `reset`, the part open now included.
  int64_t read_ns() const;
  // From zero again; a part open now counts from now.
  void reset();

 private:
  mutable std::mutex mutex_;
  int64_t reading_ = 0;  // gathers reading now
  int64_t read_ns_ = 0;  // closed parts
  std::chrono::steady_clock::time_point since_;
};

// The pread pool one or more feature stores read through (a typed graph's stores share one, so their reads together
// keep the pool's threads, not one pool's per store, in flight), owned by the process that made it. A forked child
// has none of its parent's pool threads, and one of them may have held the pool's lock at the fork: `get()` leaves
// that pool untouched in the child (never destroyed: its threads are not the child's) and starts the child's own.
class SharedIoPool {
 public:
  explicit SharedIoPool(int64_t num_threads);
  SharedIoPool(const SharedIoPool&) = delete;
  SharedIoPool& operator=(const SharedIoPool&) = delete;

  IoThreadPool& get();
  int64_t num_threads() const { return num_threads_; }
  // The time reads of any store reading through this pool were in flight (a typed graph's types' reads side by side
  // counted once: the time the disk was held for them all).
  ReadingTimer& reading() { return reading_; }

 private:
  ReadingTimer reading_;
  int64_t num_threads_;
  std::unique_ptr<IoThreadPool> pool_;
  std::atomic<pid_t> owner_;
  std::mutex new_pool_mutex_;  // taken only in a forked child's first gathers, never in the process that made pool_
};

}  // namespace morphpipe
