// Device helpers shared by the kernels: fp32 conversion of the cache types
// (FP8 E4M3 included), 8- and 16-byte loads and warp/block reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cfloat>

namespace paged_cuda {

constexpr int kWarpSize = 32;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
// An FP8 KV-cache element (vLLM's kv_cache_dtype "fp8"): E4M3 widened exactly.
__device__ __forceinline__ float to_float(__nv_fp8_e4m3 v) { return static_cast<float>(v); }

// x / scale into an FP8 cache element: round to nearest even, saturated at +-448 (NaN stays NaN),
// as vLLM stores its FP8 cache (quant_utils.cuh: __nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE, ...)).
__device__ __forceinline__ __nv_fp8_storage_t to_fp8(float v, float scale) {
  return __nv_cvt_float_to_fp8(v / scale, __NV_SATFINITE, __NV_E4M3);
}

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Loads the N elements at `src` (16 or 8 bytes, aligned to their size by the
// cache layout) in one transaction and widens them to fp32.
template <typename T, int N>
__device__ __forceinline__ void load_as_float(const T* __restrict__ src, float (&dst)[N]) {
  static_assert(N * sizeof(T) == 16 || N * sizeof(T) == 8, "16- or 8-byte loads");
  if constexpr (N * sizeof(T) == 16) {
    const uint4 raw = *reinterpret_cast<const uint4*>(src);
    const T* elems = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < N; ++i) dst[i] = to_float(elems[i]);
  } else {
    const uint2 raw = *reinterpret_cast<const uint2*>(src);
    const T* elems = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < N; ++i) dst[i] = to_float(elems[i]);
  }
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Block-wide reductions through `scratch` (one float per warp). The leading
// barrier makes back-to-back reductions safe to share one scratch array; the
// trailing one publishes the result (and any shared writes made before the call).
template <int NUM_WARPS>
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float result = -FLT_MAX;
#pragma unroll
  for (int w = 0; w < NUM_WARPS; ++w) result = fmaxf(result, scratch[w]);
  return result;
}

template <int NUM_WARPS>
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float result = 0.0f;
#pragma unroll
  for (int w = 0; w < NUM_WARPS; ++w) result += scratch[w];
  return result;
}

}  // namespace paged_cuda
