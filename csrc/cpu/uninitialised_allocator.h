// A std::vector allocator whose `resize` leaves new elements uninitialised, for buffers every element of which is
// written before it is read: the samplers grow their relabelled-node lists by a hop's edges (megabytes a batch) and
// keep only the new nodes, so a zero fill would be pure waste.
#pragma once

#include <memory>
#include <new>
#include <utility>

namespace morphpipe {

template <typename T>
struct UninitialisedAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitialisedAllocator<U>;
  };
  UninitialisedAllocator() = default;
  template <typename U>
  UninitialisedAllocator(const UninitialisedAllocator<U>&) noexcept {}
  template <typename U>
  void construct(U* place) noexcept {
    ::new (static_cast<void*>(place)) U;  // default-initialised: no zero fill for int64_t
  }
  template <typename U, typename... Args>
  void construct(U* place, Args&&... args) {
    ::new (static_cast<void*>(place)) U(std::forward<Args>(args)...);
  }
};

}  // namespace morphpipe
