// Node features on disk: the rows a batch needs are read from the dataset's feature file itself (the rows of a
// row-major array starting at a byte offset, e.g. a .npy file's data), the hottest rows from a static host-RAM
// cache and the rest with many preads in flight, rows close together in the file read with one pread.
#pragma once

#include <ATen/ATen.h>

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cpu/io_thread_pool.h"

namespace morphpipe {

// Counters since the store opened (or since reset_counters).
struct FeatureStoreCounters {
  int64_t hits = 0;        // rows copied from the cache
  int64_t misses = 0;      // rows read from the file
  int64_t reads = 0;       // preads issued for misses (after coalescing)
  int64_t bytes_read = 0;  // bytes those preads asked for
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
  std::atomic<int64_t> hits_{0}, misses_{0}, reads_{0}, bytes_read_{0};
};

}  // namespace morphpipe
