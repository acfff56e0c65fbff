// One io_uring instance driven by raw syscalls (no liburing): reads are queued as submission entries, submitted in
// one io_uring_enter, and their completions reaped, so one thread keeps many reads in flight without a thread each.
#pragma once

#include <cstdint>
#include <string>

namespace morphpipe {

class IoUring {
 public:
  // Why io_uring cannot be used in this process ("" when it can): io_uring_setup's error, e.g. ENOSYS on an old
  // kernel, EPERM under a seccomp filter or with kernel.io_uring_disabled set. Probed once per process.
  static const std::string& unavailable_reason();

  // A ring with room for `entries` reads in flight; fails with io_uring_setup's error.
  explicit IoUring(unsigned entries);
  ~IoUring();
  IoUring(const IoUring&) = delete;
  IoUring& operator=(const IoUring&) = delete;

  unsigned entries() const { return entries_; }
  // Queues a read of `length` bytes at `offset` of `fd` into `buffer`, tagged `tag`; the caller keeps at most
  // entries() reads queued or in flight.
  void queue_read(int fd, void* buffer, uint32_t length, uint64_t offset, uint64_t tag);
  // Submits the queued reads and waits until at least `wait_for` completions are ready.
  void submit_and_wait(unsigned wait_for);
  // Takes one completion if one is ready: its tag and result (bytes read, or -errno).
  bool next_completion(uint64_t& tag, int32_t& result);

 private:
  // Unmaps the rings and closes the descriptor (also what a constructor that failed half-way mapped).
  void release();

  int fd_ = -1;
  unsigned entries_ = 0;
  unsigned to_submit_ = 0;
  void* sq_ring_ = nullptr;
  size_t sq_ring_bytes_ = 0;
  void* cq_ring_ = nullptr;  // the same mapping as sq_ring_ when the kernel offers IORING_FEAT_SINGLE_MMAP
  size_t cq_ring_bytes_ = 0;
  void* sqes_ = nullptr;
  size_t sqes_bytes_ = 0;
  unsigned *sq_head_ = nullptr, *sq_tail_ = nullptr, *sq_mask_ = nullptr, *sq_array_ = nullptr;
  unsigned *cq_head_ = nullptr, *cq_tail_ = nullptr, *cq_mask_ = nullptr;
  void* cqes_ = nullptr;
};

}  // namespace morphpipe
