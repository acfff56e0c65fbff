#include "cpu/feature_store.h"

#include "cpu/io_uring.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace morphpipe {

namespace {

constexpr int64_t kPage = 4096;
// Rows closer than this in the file are read at once: reading the gap costs less than another request while
// it is shorter than the bytes the disk moves in one random read's time (its random-read bytes/s over its random
// reads/s): about 12 KiB on the virtio disk of BENCHMARKS.md, 7 KiB on a fast local NVMe drive, tens of KiB on
// cloud block storage. At 16 KiB rather than 4, the store gathered bench-10m's batches 1.12-1.18x faster at 80% of
// its arrays in RAM (BENCHMARKS.md, "Reading through the gaps between misses").
constexpr int64_t kMaxGap = 4 * kPage;
// A coalesced read stops growing at this size, so one batch still spreads over every I/O thread.
constexpr int64_t kMaxRead = 128 * 1024;

int64_t page_floor(int64_t offset) { return offset / kPage * kPage; }
int64_t page_ceil(int64_t offset) { return (offset + kPage - 1) / kPage * kPage; }

// A page-aligned scratch buffer per thread (O_DIRECT needs aligned memory), grown on demand.
struct ScratchBuffer {
  char* data = nullptr;
  int64_t size = 0;
  ~ScratchBuffer() { std::free(data); }
  char* reserve(int64_t bytes) {
    if (bytes > size) {
      std::free(data);
      data = nullptr;
      size = 0;
      void* memory = nullptr;
      TORCH_CHECK(posix_memalign(&memory, kPage, static_cast<size_t>(bytes)) == 0,
                  "FeatureStore: could not allocate a ", bytes, "-byte read buffer");
      data = static_cast<char*>(memory);
      size = bytes;
    }
    return data;
  }
};

thread_local ScratchBuffer scratch;

// The most one request asks for; a longer read (a row of over 1 GiB) continues as a short read does.
constexpr int64_t kMaxRequest = int64_t{1} << 30;

}  // namespace

// A ring lent to one gather at a time, with an aligned buffer for each read it keeps in flight.
struct FeatureStore::Ring {
  explicit Ring(int64_t depth) : ring(static_cast<unsigned>(depth)), buffers(static_cast<size_t>(depth)) {}
  IoUring ring;
  std::vector<ScratchBuffer> buffers;
  // A forked child shares the ring's memory with its parent: it must open rings of its own.
  pid_t owner = ::getpid();
};

FeatureStore::FeatureStore(std::string path, int64_t data_offset, int64_t num_rows, int64_t width,
                           at::ScalarType dtype, const at::Tensor& cached_rows, int64_t io_threads, bool direct,
                           bool io_uring, const std::shared_ptr<FeatureStore>& shares_io_with)
    : path_(std::move(path)),
      data_offset_(data_offset),
      num_rows_(num_rows),
      width_(width),
      dtype_(dtype),
      row_bytes_(width * static_cast<int64_t>(c10::elementSize(dtype))),
      direct_(direct),
      io_threads_(io_threads),
      io_uring_(io_uring) {
  TORCH_CHECK(io_threads >= 0, "io_threads: need 0 or more I/O threads, got ", io_threads);
  if (shares_io_with) {
    TORCH_CHECK(!io_uring && !shares_io_with->io_uring_ && shares_io_with->io_threads_ == io_threads,
                "shares_io_with: a store shares the pread pool of a pread store with as many I/O threads; ",
                shares_io_with->path_, " reads with ", shares_io_with->io_uring_ ? "io_uring" : "a pread pool", " and ",
                shares_io_with->io_threads_, " I/O threads, this store with ", io_uring ? "io_uring" : "a pread pool",
                " and ", io_threads);
    pool_ = shares_io_with->pool_;
  } else {
    pool_ = std::make_shared<SharedIoPool>(io_uring ? 0 : io_threads);
  }
  TORCH_CHECK(!io_uring || IoUring::unavailable_reason().empty(), "FeatureStore: io_uring was asked for, but ",
              IoUring::unavailable_reason(), "; read with the pread pool (io_uring=False)");
  TORCH_CHECK(data_offset >= 0 && num_rows >= 0 && width >= 1,
              "FeatureStore: need data_offset >= 0, num_rows >= 0, width >= 1; got ", data_offset, ", ", num_rows,
              ", ", width);
  const at::Tensor hot = cached_rows.contiguous();
  TORCH_CHECK(hot.dim() == 1 && hot.scalar_type() == at::kLong, "cached_rows: expected a 1-D int64 tensor, got ",
              hot.scalar_type(), " of shape ", hot.sizes());
  num_cached_ = hot.numel();
  TORCH_CHECK(num_cached_ < (int64_t{1} << 31), "cached_rows: at most 2^31 - 1 cached rows, got ", num_cached_);
  const int64_t* ids = hot.data_ptr<int64_t>();
  if (num_cached_ > 0) slot_of_.assign(static_cast<size_t>(num_rows_), -1);
  std::vector<int64_t> slots(static_cast<size_t>(num_cached_));
  for (int64_t slot = 0; slot < num_cached_; ++slot) {
    const int64_t row = ids[slot];
    TORCH_CHECK(row >= 0 && row < num_rows_, "cached_rows[", slot, "] = ", row, " is outside [0, ", num_rows_, ")");
    TORCH_CHECK(slot_of_[row] < 0, "cached_rows: row ", row, " is listed twice (at ", slot_of_[row], " and ", slot,
                ")");
    slot_of_[row] = static_cast<int32_t>(slot);
    slots[slot] = slot;
  }
  file_.fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
  TORCH_CHECK(file_.fd >= 0, "features file ", path_, " cannot be opened", direct ? " with O_DIRECT" : "", ": ",
              std::strerror(errno));
  struct stat info {};
  TORCH_CHECK(::fstat(file_.fd, &info) == 0, "features file ", path_, ": fstat failed: ", std::strerror(errno));
  device_ = info.st_dev;
  inode_ = info.st_ino;
  file_size_ = info.st_size;
  const int64_t needed = data_offset_ + num_rows_ * row_bytes_;
  TORCH_CHECK(file_size_ >= needed, "features file ", path_, " holds ", file_size_, " bytes, but ", num_rows_,
              " rows of ", row_bytes_, " bytes from offset ", data_offset_, " need ", needed,
              "; the file is cut short: regenerate or re-convert the dataset");
  if (!direct_) ::posix_fadvise(file_.fd, 0, 0, POSIX_FADV_RANDOM);  // no readahead: rows are read where they lie

  if (num_cached_ == 0) return;
  cache_ = at::empty({num_cached_ * row_bytes_}, at::TensorOptions().dtype(at::kByte));
  read_rows(ids, slots.data(), num_cached_, static_cast<char*>(cache_.data_ptr()));
  reset_counters();
}

FeatureStore::~FeatureStore() = default;

FeatureStore::FileDescriptor::~FileDescriptor() {
  if (fd >= 0) ::close(fd);
}

void FeatureStore::check_file_unchanged() const {
  struct stat info {};
  TORCH_CHECK(::stat(path_.c_str(), &info) == 0, "features file ", path_,
              " is gone since the dataset was opened (", std::strerror(errno),
              "); restore it and load the dataset again");
  TORCH_CHECK(info.st_dev == device_ && info.st_ino == inode_, "features file ", path_,
              " was replaced by another file since the dataset was opened; load the dataset again");
  TORCH_CHECK(info.st_size >= file_size_, "features file ", path_, " shrank from ", file_size_, " to ", info.st_size,
              " bytes since the dataset was opened (truncated in place); restore it (or regenerate the dataset) and "
              "load it again");
}

int64_t FeatureStore::request_begin(int64_t begin) const { return direct_ ? page_floor(begin) : begin; }

int64_t FeatureStore::request_end(int64_t end) const { return direct_ ? page_ceil(end) : end; }

std::string FeatureStore::read_failed(int64_t begin, int64_t end, int error) const {
  return c10::str("features file ", path_, ": reading bytes [", begin, ", ", end, ") failed: ", std::strerror(error));
}

std::string FeatureStore::ended_early(int64_t at, int64_t end) const {
  return c10::str("features file ", path_, " ends at byte ", at, ", but row data reaches byte ", end,
                  " (the file held ", file_size_, " bytes when the dataset was opened): it was truncated or "
                  "replaced while in use; restore it (or regenerate the dataset) and load it again");
}

void FeatureStore::read_exactly(char* buffer, int64_t begin, int64_t end) const {
  // O_DIRECT reads whole pages; the last page of the file may be partial, so only [begin, end) must arrive.
  const int64_t first = request_begin(begin);
  const int64_t last = request_end(end);
  int64_t done = 0;
  while (first + done < end) {
    const ssize_t got = ::pread(file_.fd, buffer + done, static_cast<size_t>(std::min(last - first - done, kMaxRequest)),
                                static_cast<off_t>(first + done));
    if (got < 0 && errno == EINTR) continue;
    TORCH_CHECK(got >= 0, read_failed(begin, end, errno));
    TORCH_CHECK(got > 0, ended_early(first + done, end));
    done += got;
  }
}

std::vector<FeatureStore::Read> FeatureStore::plan_reads(const std::vector<std::pair<int64_t, int64_t>>& order) const {
  std::vector<Read> reads;
  const int64_t count = static_cast<int64_t>(order.size());
  for (int64_t i = 0; i < count; ++i) {
    const int64_t begin = data_offset_ + order[i].first * row_bytes_;
    const int64_t end = begin + row_bytes_;
    if (!reads.empty()) {
      Read& last = reads.back();
      if (end <= last.end || (begin - last.end <= kMaxGap && end - last.begin <= kMaxRead)) {
        last.end = std::max(last.end, end);
        last.last = i + 1;
        continue;
      }
    }
    reads.push_back({begin, end, i, i + 1});
  }
  return reads;
}

int64_t FeatureStore::request_bytes(const Read& read) const {
  return request_end(read.end) - request_begin(read.begin);
}

std::pair<int64_t, int64_t> FeatureStore::count_reads(const at::Tensor& rows) const {
  TORCH_CHECK(rows.dim() == 1 && rows.scalar_type() == at::kLong, "FeatureStore.count_reads: ids must be a 1-D "
              "int64 tensor, got ", rows.scalar_type(), " of shape ", rows.sizes());
  const at::Tensor ids = rows.contiguous();
  const int64_t* data = ids.data_ptr<int64_t>();
  std::vector<std::pair<int64_t, int64_t>> order(static_cast<size_t>(ids.numel()));
  for (int64_t i = 0; i < ids.numel(); ++i) {
    TORCH_CHECK(data[i] >= 0 && data[i] < num_rows_, "FeatureStore.count_reads: ids[", i, "] = ", data[i],
                " is outside [0, ", num_rows_, ")");
    order[i] = {data[i], i};
  }
  std::sort(order.begin(), order.end());
  int64_t bytes = 0;
  const std::vector<Read> reads = plan_reads(order);
  for (const Read& read : reads) bytes += request_bytes(read);
  return {static_cast<int64_t>(reads.size()), bytes};
}

void FeatureStore::read_rows(const int64_t* rows, const int64_t* positions, int64_t count, char* out) {
  if (count == 0) return;
  std::vector<std::pair<int64_t, int64_t>> order(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) order[i] = {rows[i], positions[i]};
  std::sort(order.begin(), order.end());
  const std::vector<Read> reads = plan_reads(order);
  int64_t bytes = 0;
  for (const Read& read : reads) bytes += request_bytes(read);
  reading_.begin();
  pool_->reading().begin();
  struct DoneReading {  // also when a read fails: the time counted so far stays right
    FeatureStore& store;
    ~DoneReading() {
      store.pool_->reading().end();
      store.reading_.end();
    }
  } done_reading{*this};
  if (io_uring_) {
    read_with_ring(reads, order, out);
  } else {
    read_with_threads(reads, order, out);
  }
  reads_ += static_cast<int64_t>(reads.size());
  bytes_read_ += bytes;
  read_gathers_ += 1;
}

void FeatureStore::place_rows(const Read& read, const std::vector<std::pair<int64_t, int64_t>>& order,
                              const char* buffer, int64_t buffer_begin, char* out) const {
  for (int64_t j = read.first; j < read.last; ++j) {
    const int64_t offset = data_offset_ + order[j].first * row_bytes_ - buffer_begin;
    std::memcpy(out + order[j].second * row_bytes_, buffer + offset, static_cast<size_t>(row_bytes_));
  }
}

void FeatureStore::read_with_threads(const std::vector<Read>& reads,
                                     const std::vector<std::pair<int64_t, int64_t>>& order, char* out) {
  pool_->get().run(static_cast<int64_t>(reads.size()), [&](int64_t k) {
    const Read& read = reads[k];
    const int64_t buffer_begin = request_begin(read.begin);
    char* buffer = scratch.reserve(page_ceil(read.end) - buffer_begin);
    read_exactly(buffer, read.begin, read.end);
    place_rows(read, order, buffer, buffer_begin, out);
  });
}

void FeatureStore::read_with_ring(const std::vector<Read>& reads,
                                  const std::vector<std::pair<int64_t, int64_t>>& order, char* out) {
  const int64_t depth = io_threads_ + 1;
  std::unique_ptr<Ring> lent;
  {
    std::lock_guard<std::mutex> lock(rings_mutex_);
    if (!idle_rings_.empty() && idle_rings_.back()->owner != ::getpid()) idle_rings_.clear();  // the parent's
    if (!idle_rings_.empty()) {
      lent = std::move(idle_rings_.back());
      idle_rings_.pop_back();
    }
  }
  if (!lent) lent = std::make_unique<Ring>(depth);
  // Each entry of the ring serves one read at a time: which read, and how many of its bytes arrived.
  struct Entry {
    int64_t read = -1;
    int64_t done = 0;
  };
  std::vector<Entry> entries(static_cast<size_t>(depth));
  std::vector<int64_t> idle_entries;
  for (int64_t e = depth - 1; e >= 0; --e) idle_entries.push_back(e);
  const int64_t count = static_cast<int64_t>(reads.size());
  int64_t next = 0, in_flight = 0;
  std::string error;  // the first failure: no read is issued after it, those in flight are reaped before it is raised
  auto issue = [&](int64_t e) {  // asks for the bytes of entry e's read that have not arrived yet
    const Read& read = reads[entries[e].read];
    const int64_t first = request_begin(read.begin);
    char* buffer = lent->buffers[e].reserve(page_ceil(read.end) - first);
    const int64_t done = entries[e].done;
    lent->ring.queue_read(file_.fd, buffer + done,
                          static_cast<uint32_t>(std::min(request_end(read.end) - first - done, kMaxRequest)),
                          static_cast<uint64_t>(first + done), static_cast<uint64_t>(e));
    ++in_flight;
  };
  try {
    while (true) {
      while (error.empty() && next < count && !idle_entries.empty()) {
        const int64_t e = idle_entries.back();
        idle_entries.pop_back();
        entries[e] = {next++, 0};
        issue(e);
      }
      if (in_flight == 0) break;
      lent->ring.submit_and_wait(1);
      uint64_t tag = 0;
      int32_t result = 0;
      while (lent->ring.next_completion(tag, result)) {
        --in_flight;
        const int64_t e = static_cast<int64_t>(tag);
        const Read& read = reads[entries[e].read];
        const int64_t first = request_begin(read.begin);
        if ((result == -EINTR || result == -EAGAIN) && error.empty()) {
          issue(e);
          continue;
        }
        if (result > 0) entries[e].done += result;
        if (result > 0 && first + entries[e].done < read.end) {  // a short read: ask for the rest
          if (error.empty()) {
            issue(e);
            continue;
          }
        } else if (result > 0) {
          place_rows(read, order, lent->buffers[e].data, first, out);
        } else if (error.empty()) {
          error = result < 0 ? read_failed(read.begin, read.end, -result)
                             : ended_early(first + entries[e].done, read.end);
        }
        idle_entries.push_back(e);
      }
    }
  } catch (...) {
    // The ring failed with reads in flight: the kernel may still write into its buffers, so they are never freed.
    (void)lent.release();
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(rings_mutex_);
    idle_rings_.push_back(std::move(lent));
  }
  TORCH_CHECK(error.empty(), error);
}

void FeatureStore::gather_into(const int64_t* rows, int64_t count, at::Tensor& out) {
  TORCH_CHECK(out.is_contiguous() && out.dim() == 2 && out.size(0) >= count && out.size(1) == width_ &&
                  out.scalar_type() == dtype_,
              "FeatureStore: out must be a contiguous [>= ", count, ", ", width_, "] tensor of ", dtype_, ", got ",
              out.scalar_type(), " ", out.sizes());
  check_file_unchanged();
  char* dst = static_cast<char*>(out.data_ptr());
  if (slot_of_.empty()) {
    std::vector<int64_t> positions(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) positions[i] = i;
    read_rows(rows, positions.data(), count, dst);
    misses_ += count;
    return;
  }
  const char* cache = static_cast<const char*>(cache_.data_ptr());
  std::vector<int64_t> miss_rows, miss_positions;
  constexpr int64_t kPrefetchDistance = 8;  // cached rows are scattered in RAM, as in gather_rows_into
  for (int64_t i = 0; i < count; ++i) {
    if (i + kPrefetchDistance < count) {
      const int32_t ahead = slot_of_[rows[i + kPrefetchDistance]];
      if (ahead >= 0) {
        const char* row = cache + ahead * row_bytes_;
        for (int64_t line = 0; line < row_bytes_; line += 64) __builtin_prefetch(row + line);
      }
    }
    const int32_t slot = slot_of_[rows[i]];
    if (slot >= 0) {
      std::memcpy(dst + i * row_bytes_, cache + slot * row_bytes_, static_cast<size_t>(row_bytes_));
    } else {
      miss_rows.push_back(rows[i]);
      miss_positions.push_back(i);
    }
  }
  const int64_t num_misses = static_cast<int64_t>(miss_rows.size());
  read_rows(miss_rows.data(), miss_positions.data(), num_misses, dst);
  hits_ += count - num_misses;
  misses_ += num_misses;
}

at::Tensor FeatureStore::gather(const at::Tensor& rows) {
  TORCH_CHECK(rows.dim() == 1 && rows.scalar_type() == at::kLong, "FeatureStore.gather: ids must be a 1-D int64 "
              "tensor, got ", rows.scalar_type(), " of shape ", rows.sizes(), "; convert with .long()");
  const at::Tensor ids = rows.contiguous();
  const int64_t* data = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    TORCH_CHECK(data[i] >= 0 && data[i] < num_rows_, "FeatureStore.gather: ids[", i, "] = ", data[i],
                " is outside [0, ", num_rows_, ")");
  }
  at::Tensor out = at::empty({ids.numel(), width_}, at::TensorOptions().dtype(dtype_));
  gather_into(data, ids.numel(), out);
  return out;
}

FeatureStoreCounters FeatureStore::counters() const {
  // Gathers reading side by side may keep the reading time open for a whole epoch: the open part counts up to now.
  const int64_t read_ns = reading_.read_ns();
  return {hits_.load(), misses_.load(), reads_.load(), bytes_read_.load(), read_ns, read_gathers_.load()};
}

void FeatureStore::reset_counters() {
  hits_ = 0;
  misses_ = 0;
  reads_ = 0;
  bytes_read_ = 0;
  read_gathers_ = 0;
  reading_.reset();  // a gather reading now counts from now
}

}  // namespace morphpipe
