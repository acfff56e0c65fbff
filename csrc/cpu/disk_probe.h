// The disk under a file, measured: O_DIRECT reads at random aligned offsets with a given number in flight, or
// one after another through the file; the physical limit the feature store's misses are held to.
#pragma once

#include <cstdint>
#include <string>

namespace morphpipe {

struct DiskReadRate {
  int64_t reads = 0;
  int64_t bytes = 0;
  double seconds = 0.0;
};

// Reads of `block` bytes (a multiple of 4096) at random block-aligned offsets of `path`, `queue_depth` at once, for
// about `seconds`: kept in flight by `queue_depth` threads, or with `io_uring` by one thread and a ring that deep
// (the two ways the feature store reads).
DiskReadRate measure_random_reads(const std::string& path, int64_t block, int64_t queue_depth, double seconds,
                                  bool io_uring);

// Reads of `block` bytes (a multiple of 4096) one after another from the start of `path` (wrapping around), for
// about `seconds`.
DiskReadRate measure_sequential_reads(const std::string& path, int64_t block, double seconds);

}  // namespace morphpipe
