#include "cpu/disk_probe.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <c10/util/Exception.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/random.h"
#include "cpu/io_thread_pool.h"
#include "cpu/io_uring.h"

namespace morphpipe {

namespace {

using Clock = std::chrono::steady_clock;

// An O_DIRECT descriptor of `path` and the number of whole `block`s in it.
struct DirectFile {
  int fd = -1;
  int64_t blocks = 0;
  DirectFile(const std::string& path, int64_t block) {
    TORCH_CHECK(block >= 4096 && block % 4096 == 0, "block: need a multiple of 4096 bytes, got ", block);
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    TORCH_CHECK(fd >= 0, "disk probe: ", path, " cannot be opened with O_DIRECT: ", std::strerror(errno));
    struct stat info {};
    ::fstat(fd, &info);
    blocks = info.st_size / block;
    if (blocks < 1) ::close(fd);
    TORCH_CHECK(blocks >= 1, "disk probe: ", path, " holds ", info.st_size, " bytes, less than one ", block,
                "-byte block; measure on a larger file");
  }
  ~DirectFile() { ::close(fd); }
};

std::unique_ptr<char, decltype(&std::free)> aligned_buffer(int64_t bytes) {
  void* memory = nullptr;
  TORCH_CHECK(posix_memalign(&memory, 4096, static_cast<size_t>(bytes)) == 0, "disk probe: out of memory");
  return {static_cast<char*>(memory), &std::free};
}

void read_block(const DirectFile& file, char* buffer, int64_t block, int64_t offset, const std::string& path) {
  const ssize_t got = ::pread(file.fd, buffer, static_cast<size_t>(block), static_cast<off_t>(offset));
  TORCH_CHECK(got == block, "disk probe: reading ", block, " bytes at ", offset, " of ", path, " gave ", got,
              got < 0 ? std::string(": ") + std::strerror(errno) : std::string());
}

// The block-aligned offset of the `index`th random read of `lane`.
int64_t random_offset(const DirectFile& file, int64_t block, int64_t lane, int64_t index) {
  const uint64_t draw = splitmix64(splitmix64(static_cast<uint64_t>(lane) + 1) + static_cast<uint64_t>(index));
  return static_cast<int64_t>(draw % static_cast<uint64_t>(file.blocks)) * block;
}

DiskReadRate measure_random_reads_with_ring(const DirectFile& file, const std::string& path, int64_t block,
                                            int64_t queue_depth, double seconds) {
  IoUring ring(static_cast<unsigned>(queue_depth));
  auto buffers = aligned_buffer(block * queue_depth);
  std::vector<int64_t> issued(static_cast<size_t>(queue_depth), 0);  // reads each entry issued so far
  auto issue = [&](int64_t entry) {
    ring.queue_read(file.fd, buffers.get() + entry * block, static_cast<uint32_t>(block),
                    static_cast<uint64_t>(random_offset(file, block, entry, issued[entry]++)),
                    static_cast<uint64_t>(entry));
  };
  const auto started = Clock::now();
  const auto deadline = started + std::chrono::duration<double>(seconds);
  for (int64_t entry = 0; entry < queue_depth; ++entry) issue(entry);
  int64_t in_flight = queue_depth, reads = 0;
  std::string error;
  while (in_flight > 0) {
    ring.submit_and_wait(1);
    const bool more = Clock::now() < deadline;
    uint64_t tag = 0;
    int32_t result = 0;
    while (ring.next_completion(tag, result)) {
      --in_flight;
      if (result != block && error.empty()) {
        error = c10::str("disk probe: reading ", block, " bytes of ", path, " gave ", result,
                         result < 0 ? std::string(": ") + std::strerror(-result) : std::string());
      }
      ++reads;
      if (more && error.empty()) {
        issue(static_cast<int64_t>(tag));
        ++in_flight;
      }
    }
  }
  TORCH_CHECK(error.empty(), error);
  const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
  return {reads, reads * block, elapsed};
}

}  // namespace

DiskReadRate measure_random_reads(const std::string& path, int64_t block, int64_t queue_depth, double seconds,
                                  bool io_uring) {
  TORCH_CHECK(queue_depth >= 1, "queue_depth: need at least 1 read in flight, got ", queue_depth);
  const DirectFile file(path, block);
  if (io_uring) return measure_random_reads_with_ring(file, path, block, queue_depth, seconds);
  IoThreadPool pool(queue_depth - 1);
  std::atomic<int64_t> reads{0};
  const auto started = Clock::now();
  const auto deadline = started + std::chrono::duration<double>(seconds);
  pool.run(queue_depth, [&](int64_t lane) {
    auto buffer = aligned_buffer(block);
    int64_t done = 0;
    while (Clock::now() < deadline) {
      read_block(file, buffer.get(), block, random_offset(file, block, lane, done), path);
      ++done;
    }
    reads += done;
  });
  const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
  return {reads.load(), reads.load() * block, elapsed};
}

DiskReadRate measure_sequential_reads(const std::string& path, int64_t block, double seconds) {
  const DirectFile file(path, block);
  auto buffer = aligned_buffer(block);
  const auto started = Clock::now();
  const auto deadline = started + std::chrono::duration<double>(seconds);
  int64_t reads = 0;
  while (Clock::now() < deadline) {
    read_block(file, buffer.get(), block, (reads % file.blocks) * block, path);
    ++reads;
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
  return {reads, reads * block, elapsed};
}

}  // namespace morphpipe
