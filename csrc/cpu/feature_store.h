// Node features on disk: the rows a batch needs are read from the dataset's feature file itself (the rows of a
// row-major array starting at a byte offset, e.g. a .npy file's data), the hottest rows from a static host-RAM
// cache and the rest with many preads in flight, rows close together in the file read with one pread.
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
  int64_t reads = 0;       // preads issued for misses (after coalescing)
  int64_t bytes_read = 0;  // bytes those preads asked for
  int64_t read_ns = 0;     // wall time with reads in flight (gathers reading side by side counted once)
  int64_t read_gathers = 0;  // gathers that issued reads
};

class FeatureStore {
 public:
  // Opens `path`, whose rows [num_rows, width] of `dtype` start at byte `data_offset`; `cached_rows` (int64 ids,
  // any order, no repeats) are read into host RAM now. `io_threads` threads issue the misses' preads (beside the
  // caller); `direct` opens the file with O_DIRECT (page-aligned reads into aligned buffers, no page cache).
  FeatureStore(std::string path, int64_t data_offset, int64_t num_rows, int64_t width, at::ScalarType dtype,
               const at::Tensor& cached_rows, int64_t io_threads, bool direct);
  FeatureStore(const FeatureStore&) = delete;
  FeatureStore& operator=(const FeatureStore&) = delete;

  // rows[i] of the file for every i, as a new [len(rows), width] tensor; every id is checked first.
  at::Tensor gather(const at::Tensor& rows);
  // Writes rows[0..count) into the first `count` rows of `out` (contiguous [>= count, width] of dtype); the ids
  // must be in [0, num_rows) (the batcher's sampled ids are). Thread-safe.
  void gather_into(const int64_t* rows, int64_t count, at::Tensor& out);

  // The preads and bytes the rows `rows` (any order, repeats allowed, ids in range) would take if none were
  // cached, coalesced as a gather reads them; reads nothing.
  std::pair<int64_t, int64_t> count_reads(const at::Tensor& rows) const;

  FeatureStoreCounters counters() const;
  void reset_counters();

  const std::string& path() const { return path_; }
  int64_t num_rows() const { return num_rows_; }
  int64_t width() const { return width_; }
  at::ScalarType dtype() const { return dtype_; }
  int64_t num_cached() const { return num_cached_; }
  int64_t io_threads() const { return pool_.num_threads(); }
  bool direct() const { return direct_; }

 private:
  // A pread of file bytes [begin, end) serving sorted misses [first, last) (positions into the sorted miss list).
  struct Read {
    int64_t begin, end;
    int64_t first, last;
  };

  // The preads serving the sorted (row, position) pairs `order`, rows close together in the file read at once.
  std::vector<Read> plan_reads(const std::vector<std::pair<int64_t, int64_t>>& order) const;
  // Bytes a read asks the file for (whole pages with O_DIRECT).
  int64_t request_bytes(const Read& read) const;
  // Fails, naming the file, when the path no longer leads to the file opened or that file shrank.
  void check_file_unchanged() const;
  // Reads rows[0..count) (all misses) into the rows `positions[i]` of `out`.
  void read_rows(const int64_t* rows, const int64_t* positions, int64_t count, char* out);
  // Fills `buffer` with file bytes [begin, end); a short read or an I/O error is an error naming the file.
  void read_exactly(char* buffer, int64_t begin, int64_t end) const;

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
  int64_t num_cached_ = 0;
  at::Tensor cache_;               // uint8 [num_cached * row_bytes]
  std::vector<int32_t> slot_of_;  // row -> slot in cache_, -1 when not cached; empty without a cache
  IoThreadPool pool_;
  std::atomic<int64_t> hits_{0}, misses_{0}, reads_{0}, bytes_read_{0}, read_ns_{0}, read_gathers_{0};
  // Reads in flight: gathers reading now, and since when at least one was (one clock read per gather, not per row).
  std::mutex reading_mutex_;
  int64_t gathers_reading_ = 0;
  std::chrono::steady_clock::time_point reading_since_;
};

}  // namespace morphpipe
