// KV-cache maintenance on the CPU: scatter new tokens into their slots,
// copy-on-write block copies across layers, and whole-block swaps.
//
// These move bytes without looking at them, so they work on raw element
// sizes and need no per-dtype code; the one exception is writing into an FP8
// cache, which converts each value (x / scale, rounded, saturated at +-448).
#include "cpu_common.h"
#include "ops.h"

#include <ATen/Parallel.h>

#include <algorithm>

namespace paged_cpu {
namespace {

// Items per thread so that a thread moves at least ~256 KiB: smaller copies
// finish before a second thread would even be scheduled, so they run inline.
int64_t grain_for(int64_t bytes_per_item) { return std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(bytes_per_item, 1)); }

// Writes into an FP8 cache (x = 16): every value of a token's head converted from T.
template <typename T>
void reshape_into_fp8(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache, at::Tensor& value_cache,
                      const int64_t* slots, float k_scale, float v_scale) {
  const int64_t num_tokens = key.size(0), num_kv_heads = key.size(1), head_size = key.size(2);
  const int64_t block_size = key_cache.size(3), x = key_cache.size(4);
  const T* key_src = key.data_ptr<T>();
  const T* value_src = value.data_ptr<T>();
  Fp8E4M3* key_dst = static_cast<Fp8E4M3*>(key_cache.data_ptr());
  Fp8E4M3* value_dst = static_cast<Fp8E4M3*>(value_cache.data_ptr());
  const int64_t head_elems = head_size * block_size, block_elems = num_kv_heads * head_elems;
  at::parallel_for(0, num_tokens * num_kv_heads, grain_for(2 * head_size), [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t token = item / num_kv_heads, head = item % num_kv_heads;
      const int64_t slot = slots[token];
      if (slot < 0) continue;  // padding token
      const int64_t block = slot / block_size, offset = slot % block_size;
      const int64_t src = (token * num_kv_heads + head) * head_size;
      const int64_t base = block * block_elems + head * head_elems;
      for (int64_t d = 0; d < head_size; ++d) {
        // a division, as vLLM's kernel and the torch reference divide (a reciprocal could round otherwise)
        key_dst[base + ((d / x) * block_size + offset) * x + d % x] = from_float<Fp8E4M3>(to_float(key_src[src + d]) / k_scale);
        value_dst[base + d * block_size + offset] = from_float<Fp8E4M3>(to_float(value_src[src + d]) / v_scale);
      }
    }
  });
}

}  // namespace

void reshape_and_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,
                       at::Tensor& value_cache, const at::Tensor& slot_mapping, double k_scale, double v_scale) {
  TORCH_CHECK(key.device().is_cpu() && key_cache.device().is_cpu(), "reshape_and_cache (cpu): tensors must be on the CPU");
  TORCH_CHECK(key.is_contiguous() && value.is_contiguous() && key_cache.is_contiguous() && value_cache.is_contiguous(),
              "reshape_and_cache (cpu): tensors must be contiguous");
  if (key_cache.scalar_type() == at::kFloat8_e4m3fn) {
    PAGED_CPU_DISPATCH(key.scalar_type(), "reshape_and_cache", [&] {
      reshape_into_fp8<scalar_t>(key, value, key_cache, value_cache, slot_mapping.data_ptr<int64_t>(),
                                 static_cast<float>(k_scale), static_cast<float>(v_scale));
    });
    return;
  }
  TORCH_CHECK(key.scalar_type() == key_cache.scalar_type(), "reshape_and_cache: key and cache dtypes differ");
  const int64_t num_tokens = key.size(0), num_kv_heads = key.size(1), head_size = key.size(2);
  const int64_t block_size = key_cache.size(3), x = key_cache.size(4);
  const int64_t elem = key.element_size();
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  const char* key_src = static_cast<const char*>(key.data_ptr());
  const char* value_src = static_cast<const char*>(value.data_ptr());
  char* key_dst = static_cast<char*>(key_cache.data_ptr());
  char* value_dst = static_cast<char*>(value_cache.data_ptr());
  const int64_t head_elems = head_size * block_size;  // one head of one block, in either cache
  const int64_t block_elems = num_kv_heads * head_elems;

  at::parallel_for(0, num_tokens * num_kv_heads, grain_for(2 * head_size * elem), [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t token = item / num_kv_heads, head = item % num_kv_heads;
      const int64_t slot = slots[token];
      if (slot < 0) continue;  // padding token
      const int64_t block = slot / block_size, offset = slot % block_size;
      const int64_t src = (token * num_kv_heads + head) * head_size;
      const int64_t base = block * block_elems + head * head_elems;
      // key: chunks of x elements land at [d/x][offset][0..x)
      for (int64_t chunk = 0; chunk < head_size / x; ++chunk) {
        std::memcpy(key_dst + (base + (chunk * block_size + offset) * x) * elem, key_src + (src + chunk * x) * elem, x * elem);
      }
      // value: element d lands at [d][offset]
      for (int64_t d = 0; d < head_size; ++d) {
        std::memcpy(value_dst + (base + d * block_size + offset) * elem, value_src + (src + d) * elem, elem);
      }
    }
  });
}

void copy_blocks(std::vector<at::Tensor> const& key_caches, std::vector<at::Tensor> const& value_caches,
                 const at::Tensor& block_mapping) {
  TORCH_CHECK(key_caches.size() == value_caches.size(), "copy_blocks: key and value cache lists differ in length");
  const int64_t num_pairs = block_mapping.size(0);
  const int64_t num_layers = static_cast<int64_t>(key_caches.size());
  if (num_pairs == 0 || num_layers == 0) return;
  const at::Tensor mapping = block_mapping.to(at::kCPU).contiguous();
  const int64_t* pairs = mapping.data_ptr<int64_t>();
  const int64_t block_bytes = key_caches[0].numel() / key_caches[0].size(0) * key_caches[0].element_size();
  // One task per (cache, pair): 2 caches (key, value) per layer.
  at::parallel_for(0, 2 * num_layers * num_pairs, grain_for(block_bytes), [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t pair = item % num_pairs, cache = item / num_pairs;
      const at::Tensor& tensor = cache % 2 == 0 ? key_caches[cache / 2] : value_caches[cache / 2];
      TORCH_CHECK(tensor.device().is_cpu(), "copy_blocks (cpu): caches must be on the CPU");
      char* base = static_cast<char*>(tensor.data_ptr());
      std::memcpy(base + pairs[2 * pair + 1] * block_bytes, base + pairs[2 * pair] * block_bytes, block_bytes);
    }
  });
}

void swap_blocks(const at::Tensor& src, at::Tensor& dst, const at::Tensor& block_mapping) {
  const at::Tensor mapping = block_mapping.to(at::kCPU).contiguous();
  const int64_t* pairs = mapping.data_ptr<int64_t>();
  const int64_t num_pairs = mapping.size(0);
  if (!(src.device().is_cpu() && dst.device().is_cpu())) {
    // A cpu-backend engine swapping with a device pool: let torch move the bytes.
    for (int64_t p = 0; p < num_pairs; ++p) dst[pairs[2 * p + 1]].copy_(src[pairs[2 * p]]);
    return;
  }
  const int64_t block_bytes = src.numel() / std::max<int64_t>(src.size(0), 1) * src.element_size();
  const char* from = static_cast<const char*>(src.data_ptr());
  char* to = static_cast<char*>(dst.data_ptr());
  at::parallel_for(0, num_pairs, grain_for(block_bytes), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      std::memcpy(to + pairs[2 * p + 1] * block_bytes, from + pairs[2 * p] * block_bytes, block_bytes);
  });
}

}  // namespace paged_cpu
