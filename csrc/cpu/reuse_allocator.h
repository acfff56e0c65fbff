// torch's CPU allocator with the memory of large tensors kept for reuse. torch gets every CPU tensor of
// 2 MiB or more fresh from the kernel and hands it back when the tensor dies, so each training step and each
// batch built on demand touches its activations, gradients and feature rows page by page for the first time
// (page faults plus zeroing: 55-120 ms of system time in a 2-thread SAGE step on the default preset). Once
// installed, a freed block of at least `min_bytes` is kept, and a request is lent the smallest idle block that
// holds it if that block is at most `max_waste` times the request's size (else it takes fresh memory); the blocks held, lent or idle, never exceed the most ever lent at once, so a process keeps no more
// than its peak (a request no idle block holds releases the oldest idle blocks before taking fresh memory).
#pragma once

#include <cstdint>

namespace morphpipe {

struct CpuMemoryReuse {
  bool installed = false;
  int64_t min_bytes = 0;    // smaller requests go straight to torch's allocator
  int64_t max_waste = 0;    // an idle block is lent only to requests of at least 1/max_waste of it (0: any)
  int64_t hits = 0;         // requests lent an idle block
  int64_t misses = 0;       // requests that took fresh memory
  int64_t oversized = 0;    // of those, requests an idle block held, but at more than max_waste times their size
  int64_t released = 0;     // idle blocks handed back to the system to stay within the peak
  int64_t lent_bytes = 0;   // blocks in use now
  int64_t idle_bytes = 0;   // blocks kept for reuse now
  int64_t peak_bytes = 0;   // the most ever lent at once: the bound on lent + idle
};

// Makes torch's CPU allocator keep freed blocks of `min_bytes` or more for reuse, lending one only to a request
// of at least 1/max_waste of its size (0: to any request it holds); once per process (a second call changes
// nothing and returns false).
bool install_cpu_memory_reuse(int64_t min_bytes, int64_t max_waste);

// What the reusing allocator holds and has done (all zero before it is installed).
CpuMemoryReuse cpu_memory_reuse();

// Hands every idle block back to the system; returns the bytes released.
int64_t release_idle_cpu_memory();

}  // namespace morphpipe
