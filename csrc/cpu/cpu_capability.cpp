// The active CPU capability: detected once (cpuid, with the OS's saved register state), forcible per process.
#include "cpu/cpu_capability.h"

#include <atomic>
#include <stdexcept>
#include <tuple>

namespace morphpipe {

namespace {

constexpr const char* kNames[kCpuCapabilityCount] = {"baseline", "avx2", "avx512"};

bool compiled(CpuCapability capability) {
  return capability == CpuCapability::kBaseline || MORPHPIPE_ISA_DISPATCH;
}

bool hardware_supports(CpuCapability capability) {
#if MORPHPIPE_ISA_DISPATCH
  // libgcc's cpuid probe clears AVX/AVX-512 features whose register state the OS does not save (XGETBV).
  __builtin_cpu_init();
  switch (capability) {
    case CpuCapability::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case CpuCapability::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    default:
      return true;
  }
#else
  return capability == CpuCapability::kBaseline;
#endif
}

CpuCapability best_supported() {
  for (int level = kCpuCapabilityCount - 1; level > 0; --level) {
    if (cpu_supports(static_cast<CpuCapability>(level))) return static_cast<CpuCapability>(level);
  }
  return CpuCapability::kBaseline;
}

std::atomic<int>& active() {
  static std::atomic<int> level{static_cast<int>(best_supported())};
  return level;
}

std::atomic<int> dispatched{0};

}  // namespace

const char* capability_name(CpuCapability capability) { return kNames[static_cast<int>(capability)]; }

bool cpu_supports(CpuCapability capability) { return compiled(capability) && hardware_supports(capability); }

CpuCapability active_cpu_capability() { return static_cast<CpuCapability>(active().load(std::memory_order_relaxed)); }

void set_cpu_capability(const std::string& name) {
  std::string supported;
  for (int level = 0; level < kCpuCapabilityCount; ++level) {
    const auto capability = static_cast<CpuCapability>(level);
    if (cpu_supports(capability)) supported += std::string(supported.empty() ? "" : ", ") + kNames[level];
  }
  for (int level = 0; level < kCpuCapabilityCount; ++level) {
    if (name != kNames[level]) continue;
    const auto capability = static_cast<CpuCapability>(level);
    if (!cpu_supports(capability)) {
      throw std::invalid_argument("'" + name + "' is not available here (" +
                                  (compiled(capability) ? "this CPU lacks its instructions"
                                                        : "this build compiled no kernels for it") +
                                  "); choose one of: " + supported);
    }
    active().store(level, std::memory_order_relaxed);
    return;
  }
  throw std::invalid_argument("'" + name + "' is not a CPU capability; choose one of baseline, avx2, avx512 " +
                              "(this CPU: " + supported + ")");
}

std::vector<std::tuple<std::string, bool, bool>> cpu_capabilities() {
  std::vector<std::tuple<std::string, bool, bool>> rows;
  for (int level = 0; level < kCpuCapabilityCount; ++level) {
    const auto capability = static_cast<CpuCapability>(level);
    rows.emplace_back(kNames[level], compiled(capability), cpu_supports(capability));
  }
  return rows;
}

int take_dispatched_capabilities() { return dispatched.exchange(0, std::memory_order_relaxed); }

void note_dispatched(CpuCapability capability) {
  dispatched.fetch_or(1 << static_cast<int>(capability), std::memory_order_relaxed);
}

}  // namespace morphpipe
