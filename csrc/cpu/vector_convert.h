// Conversions between a kernel's storage type and its accumulation type that GCC vectorises: c10's bfloat16
// conversions (a NaN branch, a class constructor) leave `omp simd` loops scalar, so a bfloat16 pass ran slower than
// the float32 pass over twice the bytes. The bfloat16 forms here are plain 32-bit integer arithmetic, rounding to
// nearest even with every NaN written as 0x7FC0, exactly as c10::BFloat16(float) does; other types use static_cast.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <cstring>

namespace morphpipe {

// x in the accumulation type acc_t.
template <typename acc_t, typename scalar_t>
inline acc_t widen(scalar_t x) {
  return static_cast<acc_t>(x);
}

template <>
inline float widen<float, c10::BFloat16>(c10::BFloat16 x) {
  const uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// v rounded to the storage type scalar_t.
template <typename scalar_t, typename acc_t>
inline scalar_t narrow(acc_t v) {
  return static_cast<scalar_t>(v);
}

template <>
inline c10::BFloat16 narrow<c10::BFloat16, float>(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  const uint32_t rounded = (bits + UINT32_C(0x7FFF) + ((bits >> 16) & 1u)) >> 16;
  return c10::BFloat16(static_cast<uint16_t>(v != v ? UINT32_C(0x7FC0) : rounded), c10::BFloat16::from_bits());
}

}  // namespace morphpipe
