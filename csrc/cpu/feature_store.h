// Node features on disk: the rows a batch needs are read from the dataset's feature file itself (the rows of a
// row-major array starting at a byte offset, e.g. a .npy file's data), the hottest rows from a static host-RAM
// cache and the rest with many reads in flight (an io_uring per gathering thread, or a pool of pread threads),
// rows close together in the file read with one request.
#pragma once

#include <ATen/ATen.h>

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cpu/io_thread_pool.h"

namespace morphpipe {

// Counters since the store opened (or since reset_counters).
struct FeatureStoreCounters {
  int64_t hits = 0;        // rows copied from the cache
  int64_t misses = 0;      // rows read from the file
  int64_t reads = 0;       // reads issued for misses (after coalescing)
  int64_t bytes_read = 0;  // bytes those reads asked for
  int64_t read_ns = 0;     // wall time with reads in flight (gathers reading side by side counted once)
  int64_t read_gathers = 0;  // gathers that issued reads
};

class FeatureStore {
 public:
  // Opens `path`, whose rows [num_rows, width] of `dtype` start at byte `data_offset`; `cached_rows` (int64 ids,
  // any order, no repeats) are read into host RAM now. A gather keeps io_threads + 1 reads in flight: with
  // `io_uring`, submitted at once to a ring of that depth by the gathering thread itself (a ring per concurrent
  // gather, none of the pool's threads started); else as preads by `io_threads` pool threads beside the caller
  // (the pool shared by concurrent gathers). `direct` opens the file with O_DIRECT (page-aligned reads into
  // aligned buffers, no page cache). `shares_io_with` (a pread store of the same io_threads, or null): this store
  // reads through that store's pool instead of starting its own, so the two keep io_threads + callers reads in
  // flight together (a typed graph's stores, one per node type, share one pool this way).
  FeatureStore(std::string path, int64_t data_offset, int64_t num_rows, int64_t width, at::ScalarType dtype,
               const at::Tensor& cached_rows, int64_t io_threads, bool direct, bool io_uring,
               const std::shared_ptr<FeatureStore>& shares_io_with = nullptr);
  ~FeatureStore();
  FeatureStore(const FeatureStore&) = delete;
  FeatureStore& operator=(const FeatureStore&) = delete;

  // rows[i] of the file for every i, as a new [len(rows), width] tensor; every id is checked first.
  at::Tensor gather(const at::Tensor& rows);
  // Writes rows[0..count) into the first `count` rows of `out` (contiguous [>= count, width] of dtype); the ids
  // must be in [0, num_rows) (the batcher's sampled ids are). Thread-safe.
  void gather_into(const int64_t* rows, int64_t count, at::Tensor& out);

  // The reads and bytes the rows `rows` (any order, repeats allowed, ids in range) would take if none were
  // cached, coalesced as a gather reads them; reads nothing.
  std::pair<int64_t, int64_t> count_reads(const at::Tensor& rows) const;

  FeatureStoreCounters counters() const;
  void reset_counters();
  // The time reads of this store or any store sharing its pool were in flight (side by side counted once), since
  // the pool started or `reset_pool_read_ns`.
  int64_t pool_read_ns() const { return pool_->reading().read_ns(); }
  void reset_pool_read_ns() { pool_->reading().reset(); }

  const std::string& path() const { return path_; }
  int64_t num_rows() const { return num_rows_; }
  int64_t width() const { return width_; }
  at::ScalarType dtype() const { return dtype_; }
  int64_t num_cached() const { return num_cached_; }
  int64_t io_threads() const { return io_threads_; }
  bool direct() const { return direct_; }
  bool io_uring() const { return io_uring_; }
  // True when this store and `other` read through one pread pool.
  bool shares_io_with(const FeatureStore& other) const { return !io_uring_ && pool_ == other.pool_; }

 private:
  // A read of file bytes [begin, end) serving sorted misses [first, last) (positions into the sorted miss list).
  struct Read {
    int64_t begin, end;
    int64_t first, last;
  };

  // The reads serving the sorted (row, position) pairs `order`, rows close together in the file read at once.
  std::vector<Read> plan_reads(const std::vector<std::pair<int64_t, int64_t>>& order) const;
  // Bytes a read asks the file for (whole pages with O_DIRECT).
  int64_t request_bytes(const Read& read) const;
  // Fails, naming the file, when the path no longer leads to the file opened or that file shrank.
  void check_file_unchanged() const;
  // Reads rows[0..count) (all misses) into the rows `positions[i]` of `out`.
  void read_rows(const int64_t* rows, const int64_t* positions, int64_t count, char* out);
  // Serves `reads` (of the sorted misses `order`) into `out` with the pool's preads, or with a ring.
  void read_with_threads(const std::vector<Read>& reads, const std::vector<std::pair<int64_t, int64_t>>& order,
                         char* out);
  void read_with_ring(const std::vector<Read>& reads, const std::vector<std::pair<int64_t, int64_t>>& order,
                      char* out);
  // Copies the rows of `read`, whose bytes from file offset `buffer_begin` are in `buffer`, to their places in out.
  void place_rows(const Read& read, const std::vector<std::pair<int64_t, int64_t>>& order, const char* buffer,
                  int64_t buffer_begin, char* out) const;
  // The file bytes a read of [begin, end) asks for: whole pages with O_DIRECT.
  int64_t request_begin(int64_t begin) const;
  int64_t request_end(int64_t end) const;
  // Fills `buffer` with file bytes [begin, end); a short read or an I/O error is an error naming the file.
  void read_exactly(char* buffer, int64_t begin, int64_t end) const;
  // The errors a read of [begin, end) ends in, naming the file: the kernel's `error`, or the file's end at `at`.
  std::string read_failed(int64_t begin, int64_t end, int error) const;
  std::string ended_early(int64_t at, int64_t end) const;

  // Closes the file when the store dies, or when its constructor fails after opening it.
  struct FileDescriptor {
    int fd = -1;
    ~FileDescriptor();
  };

  std::string path_;
  FileDescriptor file_;
  dev_t device_;
  ino_t inode_;
  int64_t file_size_;
  int64_t data_offset_, num_rows_, width_;
  at::ScalarType dtype_;
  int64_t row_bytes_;
  bool direct_;
  int64_t io_threads_;
  bool io_uring_;
  int64_t num_cached_ = 0;
  at::Tensor cache_;               // uint8 [num_cached * row_bytes]
  std::vector<int32_t> slot_of_;  // row -> slot in cache_, -1 when not cached; empty without a cache
  // The pread pool (no threads with io_uring): the store's own, or the one it shares with other stores.
  std::shared_ptr<SharedIoPool> pool_;
  // Rings not lent to a gather now (io_uring only); a gather takes one, or opens one when none is idle.
  struct Ring;
  std::mutex rings_mutex_;
  std::vector<std::unique_ptr<Ring>> idle_rings_;
  std::atomic<int64_t> hits_{0}, misses_{0}, reads_{0}, bytes_read_{0}, read_gathers_{0};
  ReadingTimer reading_;  // this store's reads in flight (its pool's timer counts every sharing store's)
};

}  // namespace morphpipe
