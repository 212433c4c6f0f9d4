// KV-cache maintenance on the GPU: scatter new tokens into their slots,
// copy-on-write block copies across all layers in one launch, and block swaps
// between device and host memory with cudaMemcpyAsync.
//
// These move bits without interpreting them, so they are templated on the
// element width (2 or 4 bytes) rather than on the floating-point type; writing
// into an FP8 cache is the one that converts (x / scale, saturated E4M3).
#include "device_utils.cuh"
#include "kernels.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <tuple>

namespace paged_cuda {
namespace {

// One thread block per token; threads stride over (kv head, dim) pairs.
template <typename Bits>
__global__ void reshape_and_cache_kernel(const Bits* __restrict__ key, const Bits* __restrict__ value,
                                         Bits* __restrict__ key_cache, Bits* __restrict__ value_cache,
                                         const int64_t* __restrict__ slot_mapping, int num_kv_heads, int head_size,
                                         int block_size) {
  constexpr int X = 16 / sizeof(Bits);
  const int64_t token = blockIdx.x;
  const int64_t slot = slot_mapping[token];
  if (slot < 0) return;  // padding token
  const int64_t block = slot / block_size;
  const int offset = static_cast<int>(slot % block_size);
  const int per_token = num_kv_heads * head_size;
  const int64_t head_elems = static_cast<int64_t>(head_size) * block_size;
  for (int i = threadIdx.x; i < per_token; i += blockDim.x) {
    const int head = i / head_size, d = i % head_size;
    const int64_t base = (block * num_kv_heads + head) * head_elems;
    const int64_t src = token * per_token + i;
    key_cache[base + ((d / X) * block_size + offset) * X + d % X] = key[src];
    value_cache[base + static_cast<int64_t>(d) * block_size + offset] = value[src];
  }
}

// As reshape_and_cache_kernel, into FP8 caches (x = 16 one-byte elements per 16 bytes).
template <typename T>
__global__ void reshape_and_cache_fp8_kernel(const T* __restrict__ key, const T* __restrict__ value,
                                             __nv_fp8_storage_t* __restrict__ key_cache,
                                             __nv_fp8_storage_t* __restrict__ value_cache,
                                             const int64_t* __restrict__ slot_mapping, int num_kv_heads, int head_size,
                                             int block_size, float k_scale, float v_scale) {
  constexpr int X = 16;
  const int64_t token = blockIdx.x;
  const int64_t slot = slot_mapping[token];
  if (slot < 0) return;  // padding token
  const int64_t block = slot / block_size;
  const int offset = static_cast<int>(slot % block_size);
  const int per_token = num_kv_heads * head_size;
  const int64_t head_elems = static_cast<int64_t>(head_size) * block_size;
  for (int i = threadIdx.x; i < per_token; i += blockDim.x) {
    const int head = i / head_size, d = i % head_size;
    const int64_t base = (block * num_kv_heads + head) * head_elems;
    const int64_t src = token * per_token + i;
    key_cache[base + ((d / X) * block_size + offset) * X + d % X] = to_fp8(to_float(key[src]), k_scale);
    value_cache[base + static_cast<int64_t>(d) * block_size + offset] = to_fp8(to_float(value[src]), v_scale);
  }
}

// grid (pair, layer, cache: 0 = key / 1 = value): copies one block with 16-byte
// moves. Pairs go on x, the only grid axis without a 65535 limit.
__global__ void copy_blocks_kernel(const int64_t* __restrict__ key_cache_ptrs, const int64_t* __restrict__ value_cache_ptrs,
                                   const int64_t* __restrict__ block_mapping, int64_t block_chunks) {
  const int64_t pair = blockIdx.x;
  const int layer = blockIdx.y;
  const int64_t base = blockIdx.z == 0 ? key_cache_ptrs[layer] : value_cache_ptrs[layer];
  uint4* cache = reinterpret_cast<uint4*>(base);
  const int64_t src = block_mapping[2 * pair] * block_chunks;
  const int64_t dst = block_mapping[2 * pair + 1] * block_chunks;
  for (int64_t i = threadIdx.x; i < block_chunks; i += blockDim.x) cache[dst + i] = cache[src + i];
}

std::string cuda_error(const char* what, cudaError_t error) {
  return error == cudaSuccess ? std::string() : std::string(what) + ": " + cudaGetErrorString(error);
}

}  // namespace

std::string reshape_and_cache(const void* key, const void* value, void* key_cache, void* value_cache,
                              const int64_t* slot_mapping, int num_tokens, int num_kv_heads, int head_size,
                              int block_size, int element_size, cudaStream_t stream) {
  if (num_tokens == 0) return {};
  const int threads = num_kv_heads * head_size < 512 ? num_kv_heads * head_size : 512;
  if (element_size == 4) {
    reshape_and_cache_kernel<uint32_t><<<num_tokens, threads, 0, stream>>>(
        static_cast<const uint32_t*>(key), static_cast<const uint32_t*>(value), static_cast<uint32_t*>(key_cache),
        static_cast<uint32_t*>(value_cache), slot_mapping, num_kv_heads, head_size, block_size);
  } else if (element_size == 2) {
    reshape_and_cache_kernel<uint16_t><<<num_tokens, threads, 0, stream>>>(
        static_cast<const uint16_t*>(key), static_cast<const uint16_t*>(value), static_cast<uint16_t*>(key_cache),
        static_cast<uint16_t*>(value_cache), slot_mapping, num_kv_heads, head_size, block_size);
  } else {
    return "reshape_and_cache: element size must be 2 or 4 bytes, got " + std::to_string(element_size);
  }
  return cuda_error("reshape_and_cache launch", cudaGetLastError());
}

template <typename T>
void launch_reshape_fp8(const void* key, const void* value, void* key_cache, void* value_cache,
                        const int64_t* slot_mapping, int num_tokens, int num_kv_heads, int head_size, int block_size,
                        float k_scale, float v_scale, int threads, cudaStream_t stream) {
  reshape_and_cache_fp8_kernel<T><<<num_tokens, threads, 0, stream>>>(
      static_cast<const T*>(key), static_cast<const T*>(value), static_cast<__nv_fp8_storage_t*>(key_cache),
      static_cast<__nv_fp8_storage_t*>(value_cache), slot_mapping, num_kv_heads, head_size, block_size, k_scale,
      v_scale);
}

std::string reshape_and_cache_fp8(const void* key, const void* value, void* key_cache, void* value_cache,
                                  const int64_t* slot_mapping, int num_tokens, int num_kv_heads, int head_size,
                                  int block_size, DType dtype, float k_scale, float v_scale, cudaStream_t stream) {
  if (num_tokens == 0) return {};
  const int threads = num_kv_heads * head_size < 512 ? num_kv_heads * head_size : 512;
  const auto args = std::make_tuple(key, value, key_cache, value_cache, slot_mapping, num_tokens, num_kv_heads,
                                    head_size, block_size, k_scale, v_scale, threads, stream);
  switch (dtype) {
    case DType::kFloat32: std::apply(launch_reshape_fp8<float>, args); break;
    case DType::kFloat16: std::apply(launch_reshape_fp8<__half>, args); break;
    case DType::kBFloat16: std::apply(launch_reshape_fp8<__nv_bfloat16>, args); break;
  }
  return cuda_error("reshape_and_cache (fp8) launch", cudaGetLastError());
}

std::string copy_blocks(const int64_t* key_cache_ptrs, const int64_t* value_cache_ptrs, const int64_t* block_mapping,
                        int num_layers, int num_pairs, int64_t block_bytes, cudaStream_t stream) {
  if (num_layers == 0 || num_pairs == 0) return {};
  if (block_bytes % 16 != 0) return "copy_blocks: block size in bytes must be a multiple of 16";
  if (num_layers > 65535) return "copy_blocks: at most 65535 layers per call";
  copy_blocks_kernel<<<dim3(num_pairs, num_layers, 2), 256, 0, stream>>>(key_cache_ptrs, value_cache_ptrs,
                                                                        block_mapping, block_bytes / 16);
  return cuda_error("copy_blocks launch", cudaGetLastError());
}

std::string swap_blocks(const char* src, char* dst, const int64_t* block_mapping, int num_pairs, int64_t block_bytes,
                        cudaMemcpyKind kind, cudaStream_t stream) {
  for (int p = 0; p < num_pairs; ++p) {
    const cudaError_t error = cudaMemcpyAsync(dst + block_mapping[2 * p + 1] * block_bytes,
                                              src + block_mapping[2 * p] * block_bytes, block_bytes, kind, stream);
    if (error != cudaSuccess) return cuda_error("swap_blocks cudaMemcpyAsync", error);
  }
  return {};
}

}  // namespace paged_cuda
