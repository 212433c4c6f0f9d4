// The five paged-KV ops of the CPU backend (Python-facing signatures).
// `sinks`: optional fp32 [num_heads] attention-sink logits (see attention.cpp).
// `k_scale`, `v_scale`: the per-tensor scales of an FP8 (float8_e4m3fn) cache: stored = x / scale.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

namespace paged_cpu {

void paged_attention_v1(at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
                        const at::Tensor& value_cache, int64_t num_kv_heads, double scale,
                        const at::Tensor& block_tables, const at::Tensor& seq_lens, int64_t block_size,
                        int64_t max_seq_len, const std::optional<at::Tensor>& sinks, double k_scale,
                        double v_scale);

void paged_attention_v2(at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
                        const at::Tensor& value_cache, int64_t num_kv_heads, double scale,
                        const at::Tensor& block_tables, const at::Tensor& seq_lens, int64_t block_size,
                        int64_t max_seq_len, const std::optional<at::Tensor>& sinks, double k_scale,
                        double v_scale);

void reshape_and_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,
                       at::Tensor& value_cache, const at::Tensor& slot_mapping, double k_scale, double v_scale);

void copy_blocks(std::vector<at::Tensor> const& key_caches, std::vector<at::Tensor> const& value_caches,
                 const at::Tensor& block_mapping);

void swap_blocks(const at::Tensor& src, at::Tensor& dst, const at::Tensor& block_mapping);

}  // namespace paged_cpu
