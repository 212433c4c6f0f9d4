// Device helpers shared by the kernels: fp32 conversion of the cache types,
// 16-byte loads and warp/block reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>

namespace paged_cuda {

constexpr int kWarpSize = 32;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Loads the 16 bytes at `src` (x = 16 / sizeof(T) elements, 16-byte aligned by
// the cache layout) in one transaction and widens them to fp32.
template <typename T>
__device__ __forceinline__ void load16_as_float(const T* __restrict__ src, float (&dst)[16 / sizeof(T)]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(src);
  const T* elems = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < static_cast<int>(16 / sizeof(T)); ++i) dst[i] = to_float(elems[i]);
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
