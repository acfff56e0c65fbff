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

#include "common/random.h"
#include "cpu/io_thread_pool.h"

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

}  // namespace

DiskReadRate measure_random_reads(const std::string& path, int64_t block, int64_t queue_depth, double seconds) {
  TORCH_CHECK(queue_depth >= 1, "queue_depth: need at least 1 read in flight, got ", queue_depth);
  const DirectFile file(path, block);
  IoThreadPool pool(queue_depth - 1);
  std::atomic<int64_t> reads{0};
  const auto started = Clock::now();
  const auto deadline = started + std::chrono::duration<double>(seconds);
  pool.run(queue_depth, [&](int64_t lane) {
    auto buffer = aligned_buffer(block);
    const uint64_t stream = splitmix64(static_cast<uint64_t>(lane) + 1);
    int64_t done = 0;
    while (Clock::now() < deadline) {
      const uint64_t draw = splitmix64(stream + static_cast<uint64_t>(done));
      read_block(file, buffer.get(), block, static_cast<int64_t>(draw % static_cast<uint64_t>(file.blocks)) * block,
                 path);
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
