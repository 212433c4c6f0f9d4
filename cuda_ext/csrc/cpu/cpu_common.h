// Shared helpers for the CPU kernels: dtype conversion to fp32 and dispatch.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

namespace paged_cpu {

// All arithmetic is done in fp32; fp16/bf16 are converted on load and store.
template <typename T>
inline float to_float(T v) { return static_cast<float>(v); }

template <typename T>
inline T from_float(float v) { return static_cast<T>(v); }

// Converts n contiguous elements to fp32. For float it is a plain copy the
// compiler turns into vector moves; for bf16 it is a 16-bit shift per element.
template <typename T>
inline void load_floats(const T* __restrict src, float* __restrict dst, int n) {
  for (int i = 0; i < n; ++i) dst[i] = to_float(src[i]);
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
