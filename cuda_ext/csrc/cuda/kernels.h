// Host-side entry points of the CUDA kernels. Plain C++ (no torch headers), so
// the .cu files compile quickly and without a CUDA build of torch; the torch
// glue (devices, streams, workspace tensors) lives in bindings.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace paged_cuda {

enum class DType { kFloat32, kFloat16, kBFloat16 };

// Tokens per v2 partition: a multiple of every block size.
constexpr int kPartitionSize = 512;

struct PagedAttentionArgs {
  void* out;                // [num_seqs, num_heads, head_size]
  const void* query;        // [num_seqs, num_heads, head_size]
  const void* key_cache;    // [num_blocks, num_kv_heads, head_size/x, block_size, x]
  const void* value_cache;  // [num_blocks, num_kv_heads, head_size, block_size]
  const int32_t* block_tables;  // [num_seqs, max_blocks_per_seq]
  const int32_t* seq_lens;      // [num_seqs]
  const float* sinks;           // [num_heads] attention-sink logits (gpt-oss), or nullptr for none
  int num_seqs, num_heads, num_kv_heads, head_size, block_size, max_blocks_per_seq, max_seq_len;
  float scale;
  DType dtype;              // the query's and output's
  bool fp8_cache;           // the caches hold FP8 E4M3 (vLLM's kv_cache_dtype "fp8"), else `dtype`
  float k_scale, v_scale;   // an FP8 cache's per-tensor scales (stored = x / scale); 1 otherwise
  // v2 workspace (float32), max_partitions = ceil(max_seq_len / kPartitionSize):
  float* exp_sums;    // [num_seqs, num_heads, max_partitions]
  float* max_logits;  // [num_seqs, num_heads, max_partitions]
  float* tmp_out;     // [num_seqs, num_heads, max_partitions, head_size]
  int max_partitions;
};

// Each returns an empty string on success, else a one-line error.
std::string paged_attention_v1(const PagedAttentionArgs& args, cudaStream_t stream);
std::string paged_attention_v2(const PagedAttentionArgs& args, cudaStream_t stream);

std::string reshape_and_cache(const void* key, const void* value, void* key_cache, void* value_cache,
                              const int64_t* slot_mapping, int num_tokens, int num_kv_heads, int head_size,
                              int block_size, int element_size, cudaStream_t stream);

// The same into FP8 caches (x = 16): keys and values of `dtype`, stored as x / scale in E4M3.
std::string reshape_and_cache_fp8(const void* key, const void* value, void* key_cache, void* value_cache,
                                  const int64_t* slot_mapping, int num_tokens, int num_kv_heads, int head_size,
                                  int block_size, DType dtype, float k_scale, float v_scale, cudaStream_t stream);

// key_cache_ptrs/value_cache_ptrs: device arrays of num_layers cache base addresses;
// block_mapping: device int64 [num_pairs, 2].
std::string copy_blocks(const int64_t* key_cache_ptrs, const int64_t* value_cache_ptrs, const int64_t* block_mapping,
                        int num_layers, int num_pairs, int64_t block_bytes, cudaStream_t stream);

// block_mapping: host int64 [num_pairs, 2]; copies whole blocks with cudaMemcpyAsync.
std::string swap_blocks(const char* src, char* dst, const int64_t* block_mapping, int num_pairs, int64_t block_bytes,
                        cudaMemcpyKind kind, cudaStream_t stream);

}  // namespace paged_cuda
