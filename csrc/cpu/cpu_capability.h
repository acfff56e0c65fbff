// The CPU's instruction-set level the hot kernels run at, chosen at load time like ATen's CPU_CAPABILITY:
// each kernel header is compiled once per level into its own namespace (for_each_capability.h), and
// MORPHPIPE_CPU_DISPATCH calls the active level's copy. The active level is the best one the CPU (and its
// OS, for the wider registers' state) supports, or the one forced through set_cpu_capability, which
// refuses a level the CPU lacks: no instruction beyond what cpuid reports is ever executed.
#pragma once

#include <string>
#include <tuple>
#include <vector>

namespace morphpipe {

// Levels above baseline are compiled only where GCC's target pragmas and x86-64 cpuid exist; elsewhere the
// kernels are compiled once, for the compiler's own target.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define MORPHPIPE_ISA_DISPATCH 1
#else
#define MORPHPIPE_ISA_DISPATCH 0
#endif

// baseline: the compiler's default target (x86-64: SSE2); avx2: AVX2 + FMA; avx512: AVX-512 F/BW/VL/DQ.
enum class CpuCapability : int { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };
constexpr int kCpuCapabilityCount = 3;

const char* capability_name(CpuCapability capability);
// Whether this binary holds kernels for `capability` and this CPU and OS can run them.
bool cpu_supports(CpuCapability capability);
// The level the kernels run at now.
CpuCapability active_cpu_capability();
// Makes `name` the active level; std::invalid_argument naming the choices when it is unknown or unsupported.
void set_cpu_capability(const std::string& name);
// (name, compiled into this binary, supported by this CPU) for every level, lowest first.
std::vector<std::tuple<std::string, bool, bool>> cpu_capabilities();
// Bit i set when a kernel copy of level i ran since the last call (each copy's namespace names its level), and
// the record cleared: tests check that a forced level never runs another level's code.
int take_dispatched_capabilities();
void note_dispatched(CpuCapability capability);

}  // namespace morphpipe

// Runs the statement(s) with `isa` naming the active level's kernel namespace, e.g.
// MORPHPIPE_CPU_DISPATCH(isa::spmm_sum_kernel<scalar_t>(...)); the kernels come from for_each_capability.h.
#if MORPHPIPE_ISA_DISPATCH
#define MORPHPIPE_CPU_DISPATCH(...)                                    \
  switch (::morphpipe::active_cpu_capability()) {                      \
    case ::morphpipe::CpuCapability::kAvx512: {                        \
      namespace isa = ::morphpipe::avx512;                             \
      ::morphpipe::note_dispatched(isa::kCapability);                  \
      __VA_ARGS__;                                                     \
      break;                                                           \
    }                                                                  \
    case ::morphpipe::CpuCapability::kAvx2: {                          \
      namespace isa = ::morphpipe::avx2;                               \
      ::morphpipe::note_dispatched(isa::kCapability);                  \
      __VA_ARGS__;                                                     \
      break;                                                           \
    }                                                                  \
    default: {                                                         \
      namespace isa = ::morphpipe::baseline;                           \
      ::morphpipe::note_dispatched(isa::kCapability);                  \
      __VA_ARGS__;                                                     \
      break;                                                           \
    }                                                                  \
  }
#else
#define MORPHPIPE_CPU_DISPATCH(...)                                    \
  do {                                                                 \
    namespace isa = ::morphpipe::baseline;                             \
    ::morphpipe::note_dispatched(isa::kCapability);                    \
    __VA_ARGS__;                                                       \
  } while (false)
#endif
