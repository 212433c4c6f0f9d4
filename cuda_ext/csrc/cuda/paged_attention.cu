// Paged decode attention on the GPU.
//
// One thread block per (query head, sequence) for v1, and per (query head,
// sequence, 512-token partition) for v2, whose per-partition results are
// combined by a second kernel. Within a block:
//   1. the scaled query goes to shared memory as fp32;
//   2. each warp takes whole KV blocks; a KV block's BLOCK_SIZE tokens are
//      spread over the 32 lanes (32 / BLOCK_SIZE lanes per token), each lane
//      reading 16-byte key chunks. Lane l of the warp reads chunk k*32 + l on
//      step k, so every warp load is one contiguous 512-byte transaction;
//   3. logits live in shared memory; block-wide max and sum give the softmax;
//   4. values: again whole KV blocks per warp, lanes reading consecutive
//      16-byte chunks of the [head_size, block_size] value block; partial
//      row sums are combined across lanes by shuffles and across warps in
//      shared memory.
// Tokens past the end of a sequence in its last block are never used: their
// slots may hold stale or uninitialized data (even NaN).
// Attention sinks (optional, gpt-oss): a learned logit per head that joins the
// softmax as a token without a value, so it only enlarges the denominator:
// v1 adds exp(sink - max) to its exp-sum; v2 leaves the partitions alone and
// the reduction adds exp(sink - global max) to its total, once.
// FP8 caches (vLLM's kv_cache_dtype "fp8"): CACHE_T is __nv_fp8_e4m3, x = 16
// elements per 16-byte key chunk, value loads of min(16, BLOCK_SIZE) elements;
// the key scale is folded into the query's scale and the value scale into the
// output, so a per-tensor scale costs nothing per element.
#include "device_utils.cuh"
#include "kernels.h"

#include <cstdio>
#include <string>

namespace paged_cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarpSize;

// PARTITION_SIZE == 0: v1 (whole sequence, output written to `out`).
// PARTITION_SIZE > 0: v2 (one partition, fp32 partial results to the workspace).
// T: the query's and output's element type; CACHE_T: the caches' (T, or __nv_fp8_e4m3).
// `scale` already holds the key scale; `v_scale` multiplies the output.
template <typename T, typename CACHE_T, int HEAD_SIZE, int BLOCK_SIZE, int PARTITION_SIZE>
__global__ void __launch_bounds__(kThreads)
    paged_attention_kernel(T* __restrict__ out, float* __restrict__ exp_sums, float* __restrict__ max_logits,
                           float* __restrict__ tmp_out, const T* __restrict__ query,
                           const CACHE_T* __restrict__ key_cache, const CACHE_T* __restrict__ value_cache,
                           const int32_t* __restrict__ block_tables, const int32_t* __restrict__ seq_lens,
                           const float* __restrict__ sinks, int num_kv_heads, float scale, float v_scale,
                           int max_blocks_per_seq, int max_seq_len, int max_partitions) {
  constexpr int X = 16 / sizeof(CACHE_T);
  constexpr int KEY_CHUNKS = HEAD_SIZE / X;               // 16-byte chunks per token's key
  constexpr int LANES_PER_TOKEN = kWarpSize / BLOCK_SIZE;  // lanes sharing one token's dot product
  constexpr int VX = X < BLOCK_SIZE ? X : BLOCK_SIZE;      // elements per value load (8 or 16 bytes)
  constexpr int CHUNKS_PER_ROW = BLOCK_SIZE / VX;          // value loads per value row
  constexpr int VALUE_CHUNKS = HEAD_SIZE * CHUNKS_PER_ROW;
  constexpr int VALUE_STEPS = (VALUE_CHUNKS + kWarpSize - 1) / kWarpSize;
  constexpr int64_t HEAD_ELEMS = static_cast<int64_t>(HEAD_SIZE) * BLOCK_SIZE;
  static_assert(HEAD_SIZE % X == 0 && BLOCK_SIZE % VX == 0 && kWarpSize % BLOCK_SIZE == 0, "unsupported shape");

  const int head = blockIdx.x, seq = blockIdx.y, partition = blockIdx.z;
  const int num_heads = gridDim.x;
  const int kv_head = head / (num_heads / num_kv_heads);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int seq_len = seq_lens[seq];
  const int64_t row = static_cast<int64_t>(seq) * num_heads + head;

  // v1's logits buffer and v2's partition grid were sized from max_seq_len:
  // a longer sequence must fail loudly, never write past them or be truncated.
  const int capacity = PARTITION_SIZE > 0 ? max_partitions * PARTITION_SIZE : max_seq_len;
  if (seq_len > capacity) {
    if (threadIdx.x == 0) printf("paged_attention: seq_len %d > max_seq_len %d\n", seq_len, max_seq_len);
    __trap();
  }
  if (PARTITION_SIZE == 0 && seq_len == 0) {
    for (int d = threadIdx.x; d < HEAD_SIZE; d += kThreads) out[row * HEAD_SIZE + d] = from_float<T>(0.0f);
    return;
  }
  const int start = PARTITION_SIZE > 0 ? partition * PARTITION_SIZE : 0;
  if (start >= seq_len) return;  // v2: this partition lies past the sequence's end; the reduction skips it
  const int end = PARTITION_SIZE > 0 ? min(start + PARTITION_SIZE, seq_len) : seq_len;
  const int first_block = start / BLOCK_SIZE;
  const int end_block = (end + BLOCK_SIZE - 1) / BLOCK_SIZE;
  const int32_t* table = block_tables + static_cast<int64_t>(seq) * max_blocks_per_seq;
  const int64_t kv_block_stride = num_kv_heads * HEAD_ELEMS;

  __shared__ float query_s[HEAD_SIZE];
  __shared__ float reduce_s[kWarps];
  __shared__ float out_s[kWarps][HEAD_SIZE];
  extern __shared__ float logits[];  // [end - start]

  for (int d = threadIdx.x; d < HEAD_SIZE; d += kThreads)
    query_s[d] = to_float(query[row * HEAD_SIZE + d]) * scale;
  __syncthreads();

  // Logits.
  const int token_in_block = lane % BLOCK_SIZE;
  const int member = lane / BLOCK_SIZE;
  float thread_max = -FLT_MAX;
  for (int b = first_block + warp; b < end_block; b += kWarps) {
    const CACHE_T* key_block = key_cache + table[b] * kv_block_stride + kv_head * HEAD_ELEMS;
    float dot = 0.0f;
#pragma unroll
    for (int c = member; c < KEY_CHUNKS; c += LANES_PER_TOKEN) {
      float k[X];
      load_as_float(key_block + (c * BLOCK_SIZE + token_in_block) * X, k);
#pragma unroll
      for (int i = 0; i < X; ++i) dot += query_s[c * X + i] * k[i];
    }
#pragma unroll
    for (int offset = BLOCK_SIZE; offset < kWarpSize; offset *= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
    const int token = b * BLOCK_SIZE + token_in_block;
    if (member == 0 && token < end) {
      logits[token - start] = dot;
      thread_max = fmaxf(thread_max, dot);
    }
  }
  const float max_logit = block_max<kWarps>(thread_max, reduce_s);

  // Softmax numerators and their sum.
  float thread_sum = 0.0f;
  for (int i = threadIdx.x; i < end - start; i += kThreads) {
    const float e = __expf(logits[i] - max_logit);
    logits[i] = e;
    thread_sum += e;
  }
  const float exp_sum = block_sum<kWarps>(thread_sum, reduce_s);

  // Values: lane l holds partial sums for value rows (l + 32 * step) / CHUNKS_PER_ROW.
  float acc[VALUE_STEPS];
#pragma unroll
  for (int s = 0; s < VALUE_STEPS; ++s) acc[s] = 0.0f;
  for (int b = first_block + warp; b < end_block; b += kWarps) {
    const CACHE_T* value_block = value_cache + table[b] * kv_block_stride + kv_head * HEAD_ELEMS;
    const int block_start = b * BLOCK_SIZE;
#pragma unroll
    for (int s = 0; s < VALUE_STEPS; ++s) {
      const int c = lane + s * kWarpSize;
      if (VALUE_CHUNKS % kWarpSize == 0 || c < VALUE_CHUNKS) {
        const int first_token = block_start + (c % CHUNKS_PER_ROW) * VX;
        float v[VX];
        load_as_float(value_block + c * VX, v);
#pragma unroll
        for (int i = 0; i < VX; ++i) {
          // A skipped token, not p * v: v may be NaN in unused slots.
          if (first_token + i < end) acc[s] += logits[first_token + i - start] * v[i];
        }
      }
    }
  }
#pragma unroll
  for (int s = 0; s < VALUE_STEPS; ++s) {
#pragma unroll
    for (int offset = 1; offset < CHUNKS_PER_ROW; offset *= 2) acc[s] += __shfl_xor_sync(0xffffffffu, acc[s], offset);
    const int c = lane + s * kWarpSize;
    if (c < VALUE_CHUNKS && c % CHUNKS_PER_ROW == 0) out_s[warp][c / CHUNKS_PER_ROW] = acc[s];
  }
  __syncthreads();

  // v1 only: v2's sink joins in the reduction. An exp that overflows to inf
  // gives 0, the right limit for a sink that dwarfs every token.
  const float sink_term = (PARTITION_SIZE == 0 && sinks != nullptr) ? __expf(sinks[head] - max_logit) : 0.0f;
  const float inv_sum = v_scale / (exp_sum + sink_term);
  for (int d = threadIdx.x; d < HEAD_SIZE; d += kThreads) {
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += out_s[w][d];
    if (PARTITION_SIZE == 0) {
      out[row * HEAD_SIZE + d] = from_float<T>(total * inv_sum);
    } else {
      tmp_out[(row * max_partitions + partition) * HEAD_SIZE + d] = total * inv_sum;
    }
  }
  if (PARTITION_SIZE > 0 && threadIdx.x == 0) {
    max_logits[row * max_partitions + partition] = max_logit;
    exp_sums[row * max_partitions + partition] = exp_sum;
  }
}

// v2 reduction, one thread block per (head, sequence): rescale each
// partition's exp-sum to the global max and take the weighted mean of the
// partitions' normalized outputs.
template <typename T, int HEAD_SIZE>
__global__ void __launch_bounds__(kThreads)
    paged_attention_reduce_kernel(T* __restrict__ out, const float* __restrict__ exp_sums,
                                  const float* __restrict__ max_logits, const float* __restrict__ tmp_out,
                                  const int32_t* __restrict__ seq_lens, const float* __restrict__ sinks,
                                  int max_partitions) {
  const int head = blockIdx.x, seq = blockIdx.y;
  const int64_t row = static_cast<int64_t>(seq) * gridDim.x + head;
  const int partitions = min((seq_lens[seq] + kPartitionSize - 1) / kPartitionSize, max_partitions);
  if (partitions == 0) {
    for (int d = threadIdx.x; d < HEAD_SIZE; d += kThreads) out[row * HEAD_SIZE + d] = from_float<T>(0.0f);
    return;
  }
  __shared__ float reduce_s[kWarps];
  extern __shared__ float weights[];  // [max_partitions]
  const float* part_max = max_logits + row * max_partitions;
  const float* part_sum = exp_sums + row * max_partitions;

  float thread_max = -FLT_MAX;
  for (int p = threadIdx.x; p < partitions; p += kThreads) thread_max = fmaxf(thread_max, part_max[p]);
  const float global_max = block_max<kWarps>(thread_max, reduce_s);
  float thread_sum = 0.0f;
  for (int p = threadIdx.x; p < partitions; p += kThreads) {
    weights[p] = part_sum[p] * __expf(part_max[p] - global_max);
    thread_sum += weights[p];
  }
  const float sink_term = sinks != nullptr ? __expf(sinks[head] - global_max) : 0.0f;
  const float inv_total = 1.0f / (block_sum<kWarps>(thread_sum, reduce_s) + sink_term);

  const float* partial = tmp_out + row * max_partitions * HEAD_SIZE;
  for (int d = threadIdx.x; d < HEAD_SIZE; d += kThreads) {
    float acc = 0.0f;
    for (int p = 0; p < partitions; ++p) acc += weights[p] * partial[p * HEAD_SIZE + d];
    out[row * HEAD_SIZE + d] = from_float<T>(acc * inv_total);
  }
}

std::string cuda_error(const char* what, cudaError_t error) {
  return error == cudaSuccess ? std::string() : std::string(what) + ": " + cudaGetErrorString(error);
}

// Sets the kernel's dynamic shared-memory limit to exactly what this launch
// needs, every time (as vLLM does). The default limit of 48 KiB covers static
// and dynamic memory together, so raising it only above 48 KiB of dynamic
// memory would fail launches whose static part pushes the sum past 48 KiB.
template <typename Kernel>
std::string reserve_shared_memory(Kernel kernel, size_t bytes, const char* op) {
  int device = 0, limit = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  cudaFuncAttributes attributes{};
  std::string error = cuda_error(op, cudaFuncGetAttributes(&attributes, kernel));
  if (!error.empty()) return error;
  if (bytes + attributes.sharedSizeBytes > static_cast<size_t>(limit))
    return std::string(op) + ": max_seq_len too long for one thread block's shared memory; use paged_attention_v2";
  return cuda_error(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

template <typename T, typename CACHE_T, int HEAD_SIZE, int BLOCK_SIZE>
std::string launch(const PagedAttentionArgs& a, cudaStream_t stream, bool partitioned) {
  T* out = static_cast<T*>(a.out);
  const T* query = static_cast<const T*>(a.query);
  const CACHE_T* key_cache = static_cast<const CACHE_T*>(a.key_cache);
  const CACHE_T* value_cache = static_cast<const CACHE_T*>(a.value_cache);
  const float scale = a.scale * a.k_scale;
  if (!partitioned) {
    auto kernel = paged_attention_kernel<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, 0>;
    const size_t shared = static_cast<size_t>(a.max_seq_len > 0 ? a.max_seq_len : 1) * sizeof(float);
    std::string error = reserve_shared_memory(kernel, shared, "paged_attention_v1");
    if (!error.empty()) return error;
    kernel<<<dim3(a.num_heads, a.num_seqs, 1), kThreads, shared, stream>>>(
        out, nullptr, nullptr, nullptr, query, key_cache, value_cache, a.block_tables, a.seq_lens, a.sinks,
        a.num_kv_heads, scale, a.v_scale, a.max_blocks_per_seq, a.max_seq_len, 1);
    return cuda_error("paged_attention_v1 launch", cudaGetLastError());
  }
  auto kernel = paged_attention_kernel<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, kPartitionSize>;
  kernel<<<dim3(a.num_heads, a.num_seqs, a.max_partitions), kThreads, kPartitionSize * sizeof(float), stream>>>(
      nullptr, a.exp_sums, a.max_logits, a.tmp_out, query, key_cache, value_cache, a.block_tables, a.seq_lens,
      nullptr, a.num_kv_heads, scale, a.v_scale, a.max_blocks_per_seq, a.max_seq_len, a.max_partitions);
  std::string error = cuda_error("paged_attention_v2 launch", cudaGetLastError());
  if (!error.empty()) return error;
  auto reduce = paged_attention_reduce_kernel<T, HEAD_SIZE>;
  const size_t shared = static_cast<size_t>(a.max_partitions) * sizeof(float);
  error = reserve_shared_memory(reduce, shared, "paged_attention_v2 reduce");
  if (!error.empty()) return error;
  reduce<<<dim3(a.num_heads, a.num_seqs), kThreads, shared, stream>>>(out, a.exp_sums, a.max_logits, a.tmp_out,
                                                                     a.seq_lens, a.sinks, a.max_partitions);
  return cuda_error("paged_attention_v2 reduce launch", cudaGetLastError());
}

// PAGED_CUDA_MINIMAL_INSTANTIATIONS (used by the compile-only test) keeps one
// head size and one block size, so every kernel template is still compiled
// once per dtype at a fraction of the compile time.
template <typename T, typename CACHE_T, int HEAD_SIZE>
std::string dispatch_block_size(const PagedAttentionArgs& a, cudaStream_t stream, bool partitioned) {
  switch (a.block_size) {
#ifndef PAGED_CUDA_MINIMAL_INSTANTIATIONS
    case 8: return launch<T, CACHE_T, HEAD_SIZE, 8>(a, stream, partitioned);
    case 32: return launch<T, CACHE_T, HEAD_SIZE, 32>(a, stream, partitioned);
#endif
    case 16: return launch<T, CACHE_T, HEAD_SIZE, 16>(a, stream, partitioned);
    default: return "paged_attention: block_size " + std::to_string(a.block_size) + " not compiled (8, 16, 32)";
  }
}

template <typename T, typename CACHE_T>
std::string dispatch_head_size(const PagedAttentionArgs& a, cudaStream_t stream, bool partitioned) {
  switch (a.head_size) {
#ifndef PAGED_CUDA_MINIMAL_INSTANTIATIONS
    case 64: return dispatch_block_size<T, CACHE_T, 64>(a, stream, partitioned);
    case 80: return dispatch_block_size<T, CACHE_T, 80>(a, stream, partitioned);
    case 96: return dispatch_block_size<T, CACHE_T, 96>(a, stream, partitioned);
    case 112: return dispatch_block_size<T, CACHE_T, 112>(a, stream, partitioned);
    case 256: return dispatch_block_size<T, CACHE_T, 256>(a, stream, partitioned);
#endif
    case 128: return dispatch_block_size<T, CACHE_T, 128>(a, stream, partitioned);
    default: return "paged_attention: head_size " + std::to_string(a.head_size) + " not compiled (64, 80, 96, 112, 128, 256)";
  }
}

template <typename T>
std::string dispatch_cache(const PagedAttentionArgs& a, cudaStream_t stream, bool partitioned) {
  return a.fp8_cache ? dispatch_head_size<T, __nv_fp8_e4m3>(a, stream, partitioned)
                     : dispatch_head_size<T, T>(a, stream, partitioned);
}

std::string dispatch_dtype(const PagedAttentionArgs& a, cudaStream_t stream, bool partitioned) {
  switch (a.dtype) {
    case DType::kFloat32: return dispatch_cache<float>(a, stream, partitioned);
    case DType::kFloat16: return dispatch_cache<__half>(a, stream, partitioned);
    case DType::kBFloat16: return dispatch_cache<__nv_bfloat16>(a, stream, partitioned);
  }
  return "paged_attention: unknown dtype";
}

}  // namespace

std::string paged_attention_v1(const PagedAttentionArgs& args, cudaStream_t stream) {
  if (args.num_seqs == 0) return {};
  return dispatch_dtype(args, stream, false);
}

std::string paged_attention_v2(const PagedAttentionArgs& args, cudaStream_t stream) {
  if (args.num_seqs == 0) return {};
  if (args.max_partitions < 1) return "paged_attention_v2: workspace needs at least one partition";
  return dispatch_dtype(args, stream, true);
}

}  // namespace paged_cuda
