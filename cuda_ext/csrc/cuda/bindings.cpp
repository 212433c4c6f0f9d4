// Python bindings of the CUDA backend: turns tensors into the raw arguments
// of kernels.h, on the tensors' device and torch's current stream, and
// allocates v2's workspace. Argument validation is done in Python
// (cuda_ext/checks.py); the checks here guard only what would be memory-unsafe.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <optional>
#include <vector>

#include "kernels.h"

namespace {

paged_cuda::DType kernel_dtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return paged_cuda::DType::kFloat32;
    case at::kHalf: return paged_cuda::DType::kFloat16;
    case at::kBFloat16: return paged_cuda::DType::kBFloat16;
    default: TORCH_CHECK(false, "paged kernels: unsupported dtype ", t.scalar_type());
  }
}

void check_cuda(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

void raise_if_error(const std::string& error) { TORCH_CHECK(error.empty(), error); }

paged_cuda::PagedAttentionArgs attention_args(at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
                                              const at::Tensor& value_cache, int64_t num_kv_heads, double scale,
                                              const at::Tensor& block_tables, const at::Tensor& seq_lens,
                                              int64_t block_size, int64_t max_seq_len,
                                              const std::optional<at::Tensor>& sinks, double k_scale,
                                              double v_scale) {
  check_cuda(out, "out");
  check_cuda(query, "query");
  check_cuda(key_cache, "key_cache");
  check_cuda(value_cache, "value_cache");
  check_cuda(block_tables, "block_tables");
  check_cuda(seq_lens, "seq_lens");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && seq_lens.scalar_type() == at::kInt,
              "block_tables and seq_lens must be int32");
  if (sinks.has_value()) {
    check_cuda(*sinks, "sinks");
    TORCH_CHECK(sinks->scalar_type() == at::kFloat && sinks->dim() == 1 && sinks->size(0) == query.size(1),
                "sinks must be float32 [num_heads]");
  }
  paged_cuda::PagedAttentionArgs a{};
  a.out = out.data_ptr();
  a.query = query.data_ptr();
  a.key_cache = key_cache.data_ptr();
  a.value_cache = value_cache.data_ptr();
  a.block_tables = block_tables.data_ptr<int32_t>();
  a.seq_lens = seq_lens.data_ptr<int32_t>();
  a.sinks = sinks.has_value() ? sinks->data_ptr<float>() : nullptr;
  a.num_seqs = static_cast<int>(query.size(0));
  a.num_heads = static_cast<int>(query.size(1));
  a.head_size = static_cast<int>(query.size(2));
  a.num_kv_heads = static_cast<int>(num_kv_heads);
  a.block_size = static_cast<int>(block_size);
  a.max_blocks_per_seq = static_cast<int>(block_tables.size(1));
  a.max_seq_len = static_cast<int>(max_seq_len);
  a.scale = static_cast<float>(scale);
  a.dtype = kernel_dtype(query);
  // An FP8 cache (float8_e4m3fn) with its scales; any other cache must have the query's dtype.
  a.fp8_cache = key_cache.scalar_type() == at::kFloat8_e4m3fn;
  TORCH_CHECK(a.fp8_cache || key_cache.scalar_type() == query.scalar_type(),
              "paged attention: the caches must have the query's dtype or be float8_e4m3fn");
  a.k_scale = static_cast<float>(k_scale);
  a.v_scale = static_cast<float>(v_scale);
  return a;
}

void paged_attention_v1(at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
                        const at::Tensor& value_cache, int64_t num_kv_heads, double scale,
                        const at::Tensor& block_tables, const at::Tensor& seq_lens, int64_t block_size,
                        int64_t max_seq_len, const std::optional<at::Tensor>& sinks, double k_scale,
                        double v_scale) {
  const c10::cuda::CUDAGuard guard(query.device());
  auto a = attention_args(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens, block_size,
                          max_seq_len, sinks, k_scale, v_scale);
  raise_if_error(paged_cuda::paged_attention_v1(a, c10::cuda::getCurrentCUDAStream()));
}

void paged_attention_v2(at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
                        const at::Tensor& value_cache, int64_t num_kv_heads, double scale,
                        const at::Tensor& block_tables, const at::Tensor& seq_lens, int64_t block_size,
                        int64_t max_seq_len, const std::optional<at::Tensor>& sinks, double k_scale,
                        double v_scale) {
  const c10::cuda::CUDAGuard guard(query.device());
  auto a = attention_args(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens, block_size,
                          max_seq_len, sinks, k_scale, v_scale);
  const int64_t partitions =
      std::max<int64_t>(1, (max_seq_len + paged_cuda::kPartitionSize - 1) / paged_cuda::kPartitionSize);
  const auto options = query.options().dtype(at::kFloat);
  at::Tensor exp_sums = at::empty({a.num_seqs, a.num_heads, partitions}, options);
  at::Tensor max_logits = at::empty_like(exp_sums);
  at::Tensor tmp_out = at::empty({a.num_seqs, a.num_heads, partitions, a.head_size}, options);
  a.exp_sums = exp_sums.data_ptr<float>();
  a.max_logits = max_logits.data_ptr<float>();
  a.tmp_out = tmp_out.data_ptr<float>();
  a.max_partitions = static_cast<int>(partitions);
  raise_if_error(paged_cuda::paged_attention_v2(a, c10::cuda::getCurrentCUDAStream()));
}

void reshape_and_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache, at::Tensor& value_cache,
                       const at::Tensor& slot_mapping, double k_scale, double v_scale) {
  check_cuda(key, "key");
  check_cuda(value, "value");
  check_cuda(key_cache, "key_cache");
  check_cuda(value_cache, "value_cache");
  check_cuda(slot_mapping, "slot_mapping");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong, "slot_mapping must be int64");
  const c10::cuda::CUDAGuard guard(key.device());
  if (key_cache.scalar_type() == at::kFloat8_e4m3fn) {
    raise_if_error(paged_cuda::reshape_and_cache_fp8(
        key.data_ptr(), value.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
        slot_mapping.data_ptr<int64_t>(), static_cast<int>(key.size(0)), static_cast<int>(key.size(1)),
        static_cast<int>(key.size(2)), static_cast<int>(key_cache.size(3)), kernel_dtype(key),
        static_cast<float>(k_scale), static_cast<float>(v_scale), c10::cuda::getCurrentCUDAStream()));
    return;
  }
  TORCH_CHECK(key.scalar_type() == key_cache.scalar_type(), "reshape_and_cache: key and cache dtypes differ");
  raise_if_error(paged_cuda::reshape_and_cache(
      key.data_ptr(), value.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(), slot_mapping.data_ptr<int64_t>(),
      static_cast<int>(key.size(0)), static_cast<int>(key.size(1)), static_cast<int>(key.size(2)),
      static_cast<int>(key_cache.size(3)), static_cast<int>(key.element_size()), c10::cuda::getCurrentCUDAStream()));
}

void copy_blocks(std::vector<at::Tensor> const& key_caches, std::vector<at::Tensor> const& value_caches,
                 const at::Tensor& block_mapping) {
  TORCH_CHECK(key_caches.size() == value_caches.size(), "copy_blocks: key and value cache lists differ in length");
  if (key_caches.empty() || block_mapping.size(0) == 0) return;
  const at::Device device = key_caches[0].device();
  const c10::cuda::CUDAGuard guard(device);
  const int64_t num_layers = static_cast<int64_t>(key_caches.size());
  // One launch for every layer: the kernel reads each layer's base address from these arrays.
  at::Tensor key_ptrs = at::empty({num_layers}, at::kLong), value_ptrs = at::empty({num_layers}, at::kLong);
  int64_t* key_addresses = key_ptrs.data_ptr<int64_t>();
  int64_t* value_addresses = value_ptrs.data_ptr<int64_t>();
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    check_cuda(key_caches[layer], "key_caches[i]");
    check_cuda(value_caches[layer], "value_caches[i]");
    key_addresses[layer] = reinterpret_cast<int64_t>(key_caches[layer].data_ptr());
    value_addresses[layer] = reinterpret_cast<int64_t>(value_caches[layer].data_ptr());
  }
  key_ptrs = key_ptrs.to(device);
  value_ptrs = value_ptrs.to(device);
  const at::Tensor mapping = block_mapping.to(device, at::kLong).contiguous();
  const int64_t block_bytes = key_caches[0].numel() / key_caches[0].size(0) * key_caches[0].element_size();
  raise_if_error(paged_cuda::copy_blocks(key_ptrs.data_ptr<int64_t>(), value_ptrs.data_ptr<int64_t>(),
                                         mapping.data_ptr<int64_t>(), static_cast<int>(num_layers),
                                         static_cast<int>(mapping.size(0)), block_bytes,
                                         c10::cuda::getCurrentCUDAStream()));
}

void swap_blocks(const at::Tensor& src, at::Tensor& dst, const at::Tensor& block_mapping) {
  TORCH_CHECK(block_mapping.device().is_cpu(), "swap_blocks: block_mapping must be a CPU tensor");
  TORCH_CHECK(src.is_contiguous() && dst.is_contiguous(), "swap_blocks: src and dst must be contiguous");
  cudaMemcpyKind kind;
  if (src.is_cuda() && dst.is_cuda()) {
    TORCH_CHECK(src.device() == dst.device(), "swap_blocks: src and dst on different GPUs");
    kind = cudaMemcpyDeviceToDevice;
  } else if (src.is_cuda() && dst.is_cpu()) {
    kind = cudaMemcpyDeviceToHost;
  } else if (src.is_cpu() && dst.is_cuda()) {
    kind = cudaMemcpyHostToDevice;
  } else {
    TORCH_CHECK(false, "swap_blocks (cuda): at least one of src and dst must be a CUDA tensor");
  }
  const at::Device device = src.is_cuda() ? src.device() : dst.device();
  const c10::cuda::CUDAGuard guard(device);
  const at::Tensor mapping = block_mapping.to(at::kLong).contiguous();
  const int64_t block_bytes = src.numel() / std::max<int64_t>(src.size(0), 1) * src.element_size();
  raise_if_error(paged_cuda::swap_blocks(static_cast<const char*>(src.data_ptr()), static_cast<char*>(dst.data_ptr()),
                                         mapping.data_ptr<int64_t>(), static_cast<int>(mapping.size(0)), block_bytes,
                                         kind, c10::cuda::getCurrentCUDAStream(device.index())));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "paged-KV kernels, CUDA backend";
  // Named arguments so `sinks` and an FP8 cache's scales have defaults:
  // callers written before them keep working.
  m.def("paged_attention_v1", &paged_attention_v1, "decode attention over a paged KV cache", py::arg("out"),
        py::arg("query"), py::arg("key_cache"), py::arg("value_cache"), py::arg("num_kv_heads"), py::arg("scale"),
        py::arg("block_tables"), py::arg("seq_lens"), py::arg("block_size"), py::arg("max_seq_len"),
        py::arg("sinks") = py::none(), py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0);
  m.def("paged_attention_v2", &paged_attention_v2, "decode attention, 512-token partitions + reduction",
        py::arg("out"), py::arg("query"), py::arg("key_cache"), py::arg("value_cache"), py::arg("num_kv_heads"),
        py::arg("scale"), py::arg("block_tables"), py::arg("seq_lens"), py::arg("block_size"),
        py::arg("max_seq_len"), py::arg("sinks") = py::none(), py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0);
  m.def("reshape_and_cache", &reshape_and_cache, "scatter keys/values into cache slots", py::arg("key"),
        py::arg("value"), py::arg("key_cache"), py::arg("value_cache"), py::arg("slot_mapping"),
        py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0);
  m.def("copy_blocks", &copy_blocks, "copy blocks src->dst in every layer, one launch");
  m.def("swap_blocks", &swap_blocks, "copy whole blocks between device and host pools");
}
