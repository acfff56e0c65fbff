// What the CPU and GPU neighbour samplers share besides their argument checks (sampler_checks.h).
#pragma once

#include <cstdint>

namespace morphpipe {

// Up to this fanout a neighbour list is sampled by Floyd's algorithm; above it, Floyd's membership checks
// would cost more than a partial Fisher-Yates over the offsets (CPU) or reservoir sampling (GPU).
constexpr int64_t kFloydMaxFanout = 64;

}  // namespace morphpipe
