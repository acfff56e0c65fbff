#include "cpu/io_uring.h"

#include <linux/io_uring.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace morphpipe {

namespace {

int io_uring_setup(unsigned entries, io_uring_params* params) {
  return static_cast<int>(::syscall(__NR_io_uring_setup, entries, params));
}

int io_uring_enter(int fd, unsigned to_submit, unsigned min_complete, unsigned flags) {
  return static_cast<int>(::syscall(__NR_io_uring_enter, fd, to_submit, min_complete, flags, nullptr, 0));
}

// The ring's shared indices: the kernel reads what we store (release) and we read what it stores (acquire).
unsigned load_acquire(const unsigned* at) { return __atomic_load_n(at, __ATOMIC_ACQUIRE); }
void store_release(unsigned* at, unsigned value) { __atomic_store_n(at, value, __ATOMIC_RELEASE); }

template <typename T>
T* at_offset(void* base, unsigned offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

}  // namespace

const std::string& IoUring::unavailable_reason() {
  static const std::string reason = [] {
    io_uring_params params{};
    const int fd = io_uring_setup(1, &params);
    if (fd < 0) return std::string("io_uring_setup failed: ") + std::strerror(errno);
    ::close(fd);
    return std::string();
  }();
  return reason;
}

IoUring::IoUring(unsigned entries) {
  io_uring_params params{};
  fd_ = io_uring_setup(entries, &params);
  TORCH_CHECK(fd_ >= 0, "io_uring_setup(", entries, ") failed: ", std::strerror(errno));
  entries_ = params.sq_entries;
  sq_ring_bytes_ = params.sq_off.array + params.sq_entries * sizeof(unsigned);
  cq_ring_bytes_ = params.cq_off.cqes + params.cq_entries * sizeof(io_uring_cqe);
  const bool single_mmap = params.features & IORING_FEAT_SINGLE_MMAP;
  if (single_mmap) sq_ring_bytes_ = cq_ring_bytes_ = std::max(sq_ring_bytes_, cq_ring_bytes_);
  struct Unmap {  // a failed constructor runs no destructor: undo what was mapped so far
    IoUring& ring;
    bool done = false;
    ~Unmap() {
      if (!done) ring.release();
    }
  } unmap{*this};
  sq_ring_ = ::mmap(nullptr, sq_ring_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_,
                    IORING_OFF_SQ_RING);
  TORCH_CHECK(sq_ring_ != MAP_FAILED, "io_uring: mapping the submission ring failed: ", std::strerror(errno));
  if (single_mmap) {
    cq_ring_ = sq_ring_;
  } else {
    cq_ring_ = ::mmap(nullptr, cq_ring_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_,
                      IORING_OFF_CQ_RING);
    TORCH_CHECK(cq_ring_ != MAP_FAILED, "io_uring: mapping the completion ring failed: ", std::strerror(errno));
  }
  sqes_bytes_ = params.sq_entries * sizeof(io_uring_sqe);
  sqes_ = ::mmap(nullptr, sqes_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_, IORING_OFF_SQES);
  TORCH_CHECK(sqes_ != MAP_FAILED, "io_uring: mapping the submission entries failed: ", std::strerror(errno));
  sq_head_ = at_offset<unsigned>(sq_ring_, params.sq_off.head);
  sq_tail_ = at_offset<unsigned>(sq_ring_, params.sq_off.tail);
  sq_mask_ = at_offset<unsigned>(sq_ring_, params.sq_off.ring_mask);
  sq_array_ = at_offset<unsigned>(sq_ring_, params.sq_off.array);
  cq_head_ = at_offset<unsigned>(cq_ring_, params.cq_off.head);
  cq_tail_ = at_offset<unsigned>(cq_ring_, params.cq_off.tail);
  cq_mask_ = at_offset<unsigned>(cq_ring_, params.cq_off.ring_mask);
  cqes_ = at_offset<void>(cq_ring_, params.cq_off.cqes);
  unmap.done = true;
}

IoUring::~IoUring() { release(); }

void IoUring::release() {
  if (sqes_ != nullptr && sqes_ != MAP_FAILED) ::munmap(sqes_, sqes_bytes_);
  if (cq_ring_ != nullptr && cq_ring_ != MAP_FAILED && cq_ring_ != sq_ring_) ::munmap(cq_ring_, cq_ring_bytes_);
  if (sq_ring_ != nullptr && sq_ring_ != MAP_FAILED) ::munmap(sq_ring_, sq_ring_bytes_);
  sqes_ = cq_ring_ = sq_ring_ = nullptr;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void IoUring::queue_read(int fd, void* buffer, uint32_t length, uint64_t offset, uint64_t tag) {
  const unsigned tail = *sq_tail_;  // only this thread moves the tail
  TORCH_CHECK(tail - load_acquire(sq_head_) < entries_, "io_uring: the submission ring of ", entries_,
              " entries is full");
  const unsigned index = tail & *sq_mask_;
  io_uring_sqe* sqe = static_cast<io_uring_sqe*>(sqes_) + index;
  std::memset(sqe, 0, sizeof(*sqe));
  sqe->opcode = IORING_OP_READ;
  sqe->fd = fd;
  sqe->addr = reinterpret_cast<uint64_t>(buffer);
  sqe->len = length;
  sqe->off = offset;
  sqe->user_data = tag;
  sq_array_[index] = index;
  store_release(sq_tail_, tail + 1);
  ++to_submit_;
}

void IoUring::submit_and_wait(unsigned wait_for) {
  while (true) {
    const int submitted = io_uring_enter(fd_, to_submit_, wait_for, wait_for > 0 ? IORING_ENTER_GETEVENTS : 0);
    if (submitted >= 0) {
      to_submit_ -= static_cast<unsigned>(submitted);
      if (to_submit_ == 0) return;
      continue;  // the kernel took part of the queue (short of memory): offer it the rest
    }
    if (errno == EINTR) continue;  // a signal: what was submitted stays submitted, the rest is offered again
    if (errno == EAGAIN || errno == EBUSY) {  // completions must be reaped first; the caller does so next
      if (wait_for == 0) return;
      wait_for = 0;
      continue;
    }
    TORCH_CHECK(false, "io_uring_enter failed: ", std::strerror(errno));
  }
}

bool IoUring::next_completion(uint64_t& tag, int32_t& result) {
  const unsigned head = *cq_head_;  // only this thread moves the head
  if (head == load_acquire(cq_tail_)) return false;
  const io_uring_cqe* cqe = static_cast<const io_uring_cqe*>(cqes_) + (head & *cq_mask_);
  tag = cqe->user_data;
  result = cqe->res;
  store_release(cq_head_, head + 1);
  return true;
}

}  // namespace morphpipe
