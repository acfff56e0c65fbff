// torch's CPU allocator with large blocks kept for reuse: see reuse_allocator.h.
#include "reuse_allocator.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace morphpipe {
namespace {

constexpr size_t kGranule = size_t{2} << 20;  // blocks come in 2 MiB steps, torch's huge-page size

class ReuseCpuAllocator;
ReuseCpuAllocator* installed_allocator = nullptr;  // never destroyed: tensors it lent may outlive everything else

// torch.profiler's memory view: an idle block counts as freed (reported at `keep`), a lent one as allocated (at
// fresh allocation by the base allocator, at each lending after). Only idle blocks are destroyed: counted as
// allocated again first, so the base allocator's own report of the free finds them.
c10::ProfiledCPUMemoryReporter& profiler_memory() { return c10::profiledCPUMemoryReporter(); }

// One block of torch's memory (its DataPtr frees it), lent out or idle.
struct Block {
  c10::DataPtr memory;
  size_t capacity = 0;
  ~Block() {
    if (memory) profiler_memory().New(memory.get(), capacity);
  }
};

class ReuseCpuAllocator final : public c10::Allocator {
 public:
  ReuseCpuAllocator(c10::Allocator* base, size_t min_bytes, size_t max_waste)
      : base_(base), base_raw_deleter_(base->raw_deleter()), min_bytes_(min_bytes), max_waste_(max_waste) {
    TORCH_CHECK(base_raw_deleter_ != nullptr, "the reusing CPU allocator wraps an allocator without raw_deleter()");
  }

  c10::DataPtr allocate(size_t nbytes) override {
    if (nbytes < min_bytes_) return base_->allocate(nbytes);
    const size_t size = (nbytes + kGranule - 1) / kGranule * kGranule;
    std::unique_ptr<Block> block;
    std::vector<std::unique_ptr<Block>> release;  // freed outside the lock
    {
      std::lock_guard<std::mutex> lock(mutex_);
      // The smallest idle block that holds the request: lending any idle block adds nothing to what is held,
      // where fresh memory would (and would be faulted in page by page). One over max_waste times the request is
      // not lent (a small tensor must not hold a large block that a later large request would then take afresh):
      // the request takes fresh memory, releasing the oldest idle blocks first as below.
      auto best = idle_.end();
      for (auto it = idle_.begin(); it != idle_.end(); ++it) {
        const size_t capacity = (*it)->capacity;
        if (capacity >= size && (best == idle_.end() || capacity < (*best)->capacity)) best = it;
      }
      if (max_waste_ != 0 && best != idle_.end() && (*best)->capacity > max_waste_ * size) {
        best = idle_.end();
        ++stats_.oversized;
      }
      if (best != idle_.end()) {
        block = std::move(*best);
        idle_.erase(best);
        profiler_memory().New(block->memory.get(), block->capacity);
        idle_bytes_ -= block->capacity;
        ++stats_.hits;
      } else {
        ++stats_.misses;
        // Fresh memory: first release the oldest idle blocks until lent + idle + this stays within the peak.
        const size_t bound = std::max(peak_bytes_, lent_bytes_ + size);
        while (!idle_.empty() && lent_bytes_ + idle_bytes_ + size > bound) {
          idle_bytes_ -= idle_.front()->capacity;
          release.push_back(std::move(idle_.front()));
          idle_.pop_front();
          ++stats_.released;
        }
      }
      lent_bytes_ += block ? block->capacity : size;
      peak_bytes_ = std::max(peak_bytes_, lent_bytes_);
    }
    release.clear();
    if (!block) {
      block = std::make_unique<Block>();
      try {
        block->memory = base_->allocate(size);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        lent_bytes_ -= size;
        throw;
      }
      block->capacity = size;
    }
    // The data pointer is the context too (a "simple" DataPtr, which torch's copy-on-write clones and raw
    // allocations require); the deleter finds the block by it.
    void* data = block->memory.get();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      lent_.emplace(data, std::move(block));
    }
    return {data, data, &ReuseCpuAllocator::give_back, c10::Device(c10::DeviceType::CPU)};
  }

  // Raw allocations (oneDNN's scratch memory: raw_allocate / raw_deallocate) free through this.
  c10::DeleterFnPtr raw_deleter() const override { return &ReuseCpuAllocator::give_back; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  CpuMemoryReuse stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    CpuMemoryReuse out = stats_;
    out.installed = true;
    out.min_bytes = static_cast<int64_t>(min_bytes_);
    out.max_waste = static_cast<int64_t>(max_waste_);
    out.lent_bytes = static_cast<int64_t>(lent_bytes_);
    out.idle_bytes = static_cast<int64_t>(idle_bytes_);
    out.peak_bytes = static_cast<int64_t>(peak_bytes_);
    return out;
  }

  int64_t release_idle() {
    std::deque<std::unique_ptr<Block>> release;
    size_t bytes = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      release.swap(idle_);
      bytes = idle_bytes_;
      idle_bytes_ = 0;
      stats_.released += static_cast<int64_t>(release.size());
    }
    return static_cast<int64_t>(bytes);
  }

 private:
  static void give_back(void* data) { installed_allocator->keep(data); }

  void keep(void* data) {
    std::unique_lock<std::mutex> lock(mutex_);
    auto found = lent_.find(data);
    if (found == lent_.end()) {
      // A raw allocation torch's allocator made (below min_bytes, or before this one was installed), freed
      // through raw_deleter(): its own deleter frees it.
      lock.unlock();
      base_raw_deleter_(data);
      return;
    }
    std::unique_ptr<Block> block = std::move(found->second);
    lent_.erase(found);
    lent_bytes_ -= block->capacity;
    idle_bytes_ += block->capacity;
    profiler_memory().Delete(data);  // under the lock: lending it again reports after this
    idle_.push_back(std::move(block));
  }

  c10::Allocator* base_;
  c10::DeleterFnPtr base_raw_deleter_;
  size_t min_bytes_;
  size_t max_waste_;  // 0: any idle block that holds the request
  std::mutex mutex_;
  std::deque<std::unique_ptr<Block>> idle_;  // oldest returned first
  std::unordered_map<void*, std::unique_ptr<Block>> lent_;  // by data pointer
  size_t lent_bytes_ = 0;
  size_t idle_bytes_ = 0;
  size_t peak_bytes_ = 0;
  CpuMemoryReuse stats_;
};

std::mutex install_mutex;

}  // namespace

bool install_cpu_memory_reuse(int64_t min_bytes, int64_t max_waste) {
  TORCH_CHECK(min_bytes > 0, "install_cpu_memory_reuse: min_bytes must be positive, got ", min_bytes);
  TORCH_CHECK(max_waste >= 0, "install_cpu_memory_reuse: max_waste must be 0 (no limit) or at least 1, got ",
              max_waste);
  std::lock_guard<std::mutex> lock(install_mutex);
  if (installed_allocator != nullptr) return false;
  installed_allocator = new ReuseCpuAllocator(c10::GetCPUAllocator(), static_cast<size_t>(min_bytes),
                                                    static_cast<size_t>(max_waste));
  c10::SetCPUAllocator(installed_allocator, /*priority=*/1);
  return true;
}

CpuMemoryReuse cpu_memory_reuse() {
  std::lock_guard<std::mutex> lock(install_mutex);
  return installed_allocator != nullptr ? installed_allocator->stats() : CpuMemoryReuse{};
}

int64_t release_idle_cpu_memory() {
  std::lock_guard<std::mutex> lock(install_mutex);
  return installed_allocator != nullptr ? installed_allocator->release_idle() : 0;
}

}  // namespace morphpipe
