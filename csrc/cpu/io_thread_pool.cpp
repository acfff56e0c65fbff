#include "cpu/io_thread_pool.h"

#include <unistd.h>

#include <algorithm>

namespace morphpipe {

IoThreadPool::IoThreadPool(int64_t num_threads) {
  for (int64_t t = 0; t < num_threads; ++t) threads_.emplace_back(&IoThreadPool::thread_loop, this);
}

IoThreadPool::~IoThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_available_.notify_all();
  for (auto& thread : threads_) thread.join();
}

bool IoThreadPool::work_on(Job& job) {
  bool worked = false;
  while (true) {
    const int64_t index = job.next_task.fetch_add(1);
    if (index >= job.count) return worked;
    worked = true;
    std::exception_ptr error;
    try {
      (*job.task)(index);
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(job.mutex);
    if (error && !job.error) job.error = error;
    if (++job.finished == job.count) job.all_finished.notify_all();
  }
}

void IoThreadPool::thread_loop() {
  while (true) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_available_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (stopping_) return;
      job = jobs_.front();
      if (job->next_task.load() >= job->count) {
        jobs_.pop_front();  // every task claimed: the job's runners finish it
        continue;
      }
    }
    work_on(*job);
  }
}

void IoThreadPool::run(int64_t count, const std::function<void(int64_t)>& task) {
  if (count <= 0) return;
  auto job = std::make_shared<Job>();
  job->task = &task;
  job->count = count;
  if (count > 1 && !threads_.empty()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back(job);
    }
    if (count - 1 >= num_threads()) {
      work_available_.notify_all();
    } else {
      for (int64_t i = 0; i < count - 1; ++i) work_available_.notify_one();
    }
  }
  work_on(*job);
  {
    std::unique_lock<std::mutex> lock(job->mutex);
    job->all_finished.wait(lock, [&] { return job->finished == job->count; });
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto position = std::find(jobs_.begin(), jobs_.end(), job);
    if (position != jobs_.end()) jobs_.erase(position);
  }
  if (job->error) std::rethrow_exception(job->error);
}

void ReadingTimer::begin() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (reading_++ == 0) since_ = std::chrono::steady_clock::now();
}

void ReadingTimer::end() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (--reading_ == 0) {
    read_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - since_).count();
  }
}

int64_t ReadingTimer::read_ns() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (reading_ == 0) return read_ns_;
  return read_ns_ +
         std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - since_).count();
}

void ReadingTimer::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  read_ns_ = 0;
  if (reading_ > 0) since_ = std::chrono::steady_clock::now();
}

SharedIoPool::SharedIoPool(int64_t num_threads)
    : num_threads_(std::max<int64_t>(num_threads, 0)),
      pool_(std::make_unique<IoThreadPool>(num_threads_)),
      owner_(::getpid()) {}

IoThreadPool& SharedIoPool::get() {
  const pid_t pid = ::getpid();
  if (owner_.load(std::memory_order_acquire) != pid) {
    std::lock_guard<std::mutex> lock(new_pool_mutex_);
    if (owner_.load(std::memory_order_relaxed) != pid) {
      (void)pool_.release();  // the parent's: its threads and lock are not this process's to use or join
      pool_ = std::make_unique<IoThreadPool>(num_threads_);
      owner_.store(pid, std::memory_order_release);
    }
  }
  return *pool_;
}

}  // namespace morphpipe
