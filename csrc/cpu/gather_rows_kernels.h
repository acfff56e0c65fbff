// The row gather's kernel, compiled once per CPU capability by for_each_capability.h (no includes, no include
// guard: gather_rows.cpp includes what it needs first). Each row is a memory miss of its own, so the loop keeps
// many rows in flight: rows far ahead are prefetched into L2 (whose miss queue holds more lines than L1's fill
// buffers) and rows near into L1. When asked to, rows that are whole 64-byte lines into a line-aligned output
// are written with non-temporal stores: a recycled output (tens of MB a batch, not cached) goes straight to
// memory instead of reading each line in first and evicting the source rows still ahead. On the Xeon of
// BENCHMARKS.md both made a 1-thread gather of random 256-byte rows into a reused buffer 1.6x faster.

// Rows prefetched into L2 this many bytes of rows ahead (at least kL1AheadRows + 8 rows, at most 64 rows).
constexpr int64_t kL2AheadBytes = 16 * 1024;
constexpr int64_t kL1AheadRows = 8;
constexpr int64_t kLineBytes = 64;

// One 64-byte line from `src` (any alignment) to the line-aligned `dst` with non-temporal stores, at the widest
// vector of this level. A template so that only this level's branch is instantiated (the others' intrinsics
// need instruction sets this copy is not compiled for).
template <int = 0>
inline void stream_line(char* dst, const char* src) {
#if defined(__x86_64__)
  if constexpr (kCapability == CpuCapability::kAvx512) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst), _mm512_loadu_si512(src));
  } else if constexpr (kCapability == CpuCapability::kAvx2) {
    for (int64_t i = 0; i < kLineBytes; i += 32)
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
  } else {
    for (int64_t i = 0; i < kLineBytes; i += 16)
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
  }
#else
  std::memcpy(dst, src, kLineBytes);
#endif
}

// Whether gather_rows_kernel, asked to stream, writes rows of `row_bytes` into `dst` with non-temporal stores.
inline bool streams_rows(const char* dst, int64_t row_bytes) {
#if defined(__x86_64__)
  return row_bytes % kLineBytes == 0 && reinterpret_cast<uintptr_t>(dst) % kLineBytes == 0;
#else
  return false;
#endif
}

// dst row i = src row rows[i], for i in [0, count); rows are `row_bytes` bytes, the ids in range; non-temporal
// stores when `stream_asked` and the rows allow (streams_rows).
inline void gather_rows_kernel(const char* src, const int64_t* rows, int64_t count, int64_t row_bytes, char* dst,
                               bool stream_asked) {
  const int64_t l2_ahead = std::min<int64_t>(std::max<int64_t>(kL2AheadBytes / row_bytes, kL1AheadRows + 8), 64);
  const bool stream = stream_asked && streams_rows(dst, row_bytes);
  for (int64_t i = 0; i < count; ++i) {
    if (i + l2_ahead < count) {
      const char* ahead = src + rows[i + l2_ahead] * row_bytes;
      for (int64_t line = 0; line < row_bytes; line += kLineBytes) __builtin_prefetch(ahead + line, 0, 1);
    }
    if (i + kL1AheadRows < count) {
      const char* ahead = src + rows[i + kL1AheadRows] * row_bytes;
      for (int64_t line = 0; line < row_bytes; line += kLineBytes) __builtin_prefetch(ahead + line, 0, 3);
    }
    const char* row = src + rows[i] * row_bytes;
    char* out = dst + i * row_bytes;
    if (stream) {
      for (int64_t line = 0; line < row_bytes; line += kLineBytes) stream_line(out + line, row + line);
    } else {
      std::memcpy(out, row, row_bytes);
    }
  }
#if defined(__x86_64__)
  // Non-temporal stores are weakly ordered: fence them before another thread may read the rows.
  if (stream) _mm_sfence();
#endif
}
