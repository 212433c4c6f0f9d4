// Shared helpers for the CPU kernels: dtype conversion to fp32 and dispatch.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

namespace paged_cpu {

// One element of an FP8 KV cache (vLLM's kv_cache_dtype "fp8": OCP E4M3, no infinities, +-448 max).
struct Fp8E4M3 {
  uint8_t bits;
};
static_assert(sizeof(Fp8E4M3) == 1, "an FP8 element is one byte");
constexpr float kFp8Max = 448.0f;

// The 256 E4M3 values as fp32, decoded once by torch's own conversion, so a read is one table load.
inline const std::array<float, 256>& fp8_values() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b)
      t[b] = static_cast<float>(c10::Float8_e4m3fn(static_cast<uint8_t>(b), c10::Float8_e4m3fn::from_bits()));
    return t;
  }();
  return table;
}

// All arithmetic is done in fp32; fp16/bf16 (and FP8 cache elements) are converted on load and store.
template <typename T>
inline float to_float(T v) { return static_cast<float>(v); }
inline float to_float(Fp8E4M3 v) { return fp8_values()[v.bits]; }

template <typename T>
inline T from_float(float v) { return static_cast<T>(v); }
// Round to nearest even, saturated at +-448 as vLLM's __NV_SATFINITE conversion (NaN stays NaN).
template <>
inline Fp8E4M3 from_float<Fp8E4M3>(float v) {
  const float clamped = v != v ? v : std::min(std::max(v, -kFp8Max), kFp8Max);
  return Fp8E4M3{c10::Float8_e4m3fn(clamped).x};
}

// Converts n contiguous elements to fp32. For float it is a plain copy the
// compiler turns into vector moves; for bf16 it is a 16-bit shift per element;
// for FP8 one table load.
template <typename T>
inline void load_floats(const T* __restrict src, float* __restrict dst, int n) {
  for (int i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}
inline void load_floats(const Fp8E4M3* __restrict src, float* __restrict dst, int n) {
  const float* values = fp8_values().data();
  for (int i = 0; i < n; ++i) dst[i] = values[src[i].bits];
}

// Runs `body` with `scalar_t` bound to the C++ type of `dtype`.
#define PAGED_CPU_DISPATCH(dtype, name, ...)                                   \
  [&] {                                                                       \
    switch (dtype) {                                                          \
      case at::ScalarType::Float: { using scalar_t = float; return __VA_ARGS__(); } \
      case at::ScalarType::Half: { using scalar_t = c10::Half; return __VA_ARGS__(); } \
      case at::ScalarType::BFloat16: { using scalar_t = c10::BFloat16; return __VA_ARGS__(); } \
      default: TORCH_CHECK(false, name ": unsupported dtype ", dtype, " (float32, float16, bfloat16 only)"); \
    }                                                                         \
  }()

}  // namespace paged_cpu
