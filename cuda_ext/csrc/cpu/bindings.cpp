// Python bindings of the CPU backend (torch.utils.cpp_extension JIT module).
#include <torch/extension.h>

#include "ops.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "paged-KV kernels, CPU (C++/OpenMP) backend";
  // Named arguments so `sinks` and the FP8 cache's scales have defaults:
  // callers written before them keep working.
  m.def("paged_attention_v1", &paged_cpu::paged_attention_v1, "decode attention over a paged KV cache",
        py::arg("out"), py::arg("query"), py::arg("key_cache"), py::arg("value_cache"), py::arg("num_kv_heads"),
        py::arg("scale"), py::arg("block_tables"), py::arg("seq_lens"), py::arg("block_size"),
        py::arg("max_seq_len"), py::arg("sinks") = py::none(), py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0);
  m.def("paged_attention_v2", &paged_cpu::paged_attention_v2, "decode attention, 512-token partitions + reduction",
        py::arg("out"), py::arg("query"), py::arg("key_cache"), py::arg("value_cache"), py::arg("num_kv_heads"),
        py::arg("scale"), py::arg("block_tables"), py::arg("seq_lens"), py::arg("block_size"),
        py::arg("max_seq_len"), py::arg("sinks") = py::none(), py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0);
  m.def("reshape_and_cache", &paged_cpu::reshape_and_cache, "scatter keys/values into cache slots", py::arg("key"),
        py::arg("value"), py::arg("key_cache"), py::arg("value_cache"), py::arg("slot_mapping"),
        py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0);
  m.def("copy_blocks", &paged_cpu::copy_blocks, "copy blocks src->dst in every layer");
  m.def("swap_blocks", &paged_cpu::swap_blocks, "copy whole blocks between two pools");
}
