// Compiles the kernel header named by MORPHPIPE_KERNELS once per CPU capability, into
// morphpipe::baseline, morphpipe::avx2 and morphpipe::avx512 (anonymous inner namespaces: nothing is shared
// between the copies, so the linker can never pick one level's copy for another); each namespace's kCapability
// names its level, which MORPHPIPE_CPU_DISPATCH records for the copy it actually calls. The wider levels are
// compiled under GCC target pragmas, so one translation unit and one set of compiler flags serve both
// builds (native.py's JIT and setup.py). No include guard: an op source includes it once, after every
// header it and the kernels need (those stay compiled for the baseline; the kernel header includes nothing),
// and dispatches with MORPHPIPE_CPU_DISPATCH (cpu_capability.h).
#ifndef MORPHPIPE_KERNELS
#error "define MORPHPIPE_KERNELS as the kernel header to compile per capability"
#endif

#include "cpu/cpu_capability.h"

namespace morphpipe {
namespace baseline {
constexpr CpuCapability kCapability = CpuCapability::kBaseline;
namespace {
#include MORPHPIPE_KERNELS
}  // namespace
}  // namespace baseline
}  // namespace morphpipe

#if MORPHPIPE_ISA_DISPATCH
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace morphpipe {
namespace avx2 {
constexpr CpuCapability kCapability = CpuCapability::kAvx2;
namespace {
#include MORPHPIPE_KERNELS
}  // namespace
}  // namespace avx2
}  // namespace morphpipe
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,prefer-vector-width=512")
namespace morphpipe {
namespace avx512 {
constexpr CpuCapability kCapability = CpuCapability::kAvx512;
namespace {
#include MORPHPIPE_KERNELS
}  // namespace
}  // namespace avx512
}  // namespace morphpipe
#pragma GCC pop_options
#endif

#undef MORPHPIPE_KERNELS
