// Paged decode attention on the CPU (v1: whole context; v2: 512-token
// partitions plus a reduction).
//
// Work item = (sequence, kv head [, partition]). All query heads of a GQA
// group are handled by the same item, so every key/value block is read from
// memory once per group: decode attention is memory-bound, and this is what
// decides its speed.
//
// Two passes over the blocks with a logits scratch buffer (rather than an
// online softmax): pass 1 reads keys and writes logits, pass 2 reads values.
// That avoids rescaling the accumulators per block and keeps both inner loops
// free of data-dependent branches so they vectorize.
//
// Attention sinks (optional, gpt-oss): one learned logit per query head that
// joins the softmax as a token without a value. It only enlarges the softmax
// denominator, so it is applied after the spans: v1 rescales its output by
// sum / (sum + exp(sink - max)); v2 adds exp(sink - global max) to the
// reduction's total once.
//
// FP8 caches (vLLM's kv_cache_dtype "fp8"): the cache element type C is then
// Fp8E4M3 (x = 16 elements per 16 bytes), widened by table lookup; the key
// scale is folded into the query's and the value scale into the output, so a
// per-tensor scale costs nothing per element.
#include "cpu_common.h"
#include "ops.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

namespace paged_cpu {
namespace {

constexpr int kPartitionSize = 512;  // tokens per v2 partition (a multiple of every block size)

// T: the query's and output's element type; C: the cache's (T, or Fp8E4M3).
template <typename T, typename C>
struct AttentionInputs {
  const T* query;        // [num_seqs, num_heads, head_size]
  const C* key_cache;    // [num_blocks, num_kv_heads, head_size/x, block_size, x]
  const C* value_cache;  // [num_blocks, num_kv_heads, head_size, block_size]
  const int32_t* block_tables;
  const int32_t* seq_lens;
  const float* sinks;    // [num_heads] or nullptr
  int num_heads, num_kv_heads, group, head_size, max_blocks_per_seq;
  float scale;           // softmax scale times the key scale
  float value_scale;     // the value scale (1 unless an FP8 cache has one)
};

// Per-thread buffers, grown on demand and reused across work items and calls.
struct Scratch {
  std::vector<float> query_pattern;  // [group][head_size/x][block_size*x]
  std::vector<float> logits;         // [group][span rounded up to blocks]
  std::vector<float> acc;            // pass-1 and pass-2 accumulators
  std::vector<float> row;            // one key/value row converted to fp32
};
thread_local Scratch tls_scratch;

// acc[e] += a[e] * b[e] for N contiguous floats. A separate function with
// restrict-qualified pointers, because inside the kernel GCC cannot prove the
// buffers do not overlap and otherwise emits scalar code for the value pass.
template <int N>
inline void multiply_add(float* __restrict acc, const float* __restrict a, const float* __restrict b) {
#pragma omp simd
  for (int e = 0; e < N; ++e) acc[e] += a[e] * b[e];
}

// exp(x) for x <= 88 (softmax only sees x <= 0), branch-free so the softmax
// loop vectorizes (libm's expf is a scalar call). Cody-Waite reduction
// x = n ln2 + r with |r| <= ln2/2, then Cephes' degree-6 polynomial for e^r
// (relative error about 1e-7) and 2^n assembled in the exponent bits.
inline float vector_exp(float x) {
  x = std::max(std::min(x, 88.0f), -87.0f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  return er * two_n;
}

// Attention of one (sequence, kv head) group over tokens [begin, end) of the
// sequence. `begin` is a multiple of BS. Writes, per query head g of the group:
// out[g * head_size + d] (normalized by this span's softmax sum),
// span_max[g] = max logit, span_sum[g] = sum of exp(logit - max).
template <typename T, typename C, int BS>
void attend_span(const AttentionInputs<T, C>& in, int seq, int kv_head, int begin, int end,
                 float* out, float* span_max, float* span_sum) {
  constexpr int X = 16 / static_cast<int>(sizeof(C));
  constexpr int ROW = BS * X;  // one [block_size, x] slice of a key block
  const int G = in.group, D = in.head_size, DX = D / X;
  const int span = end - begin;
  const int num_blocks = (span + BS - 1) / BS;
  const int logits_stride = num_blocks * BS;
  const int32_t* table = in.block_tables + static_cast<int64_t>(seq) * in.max_blocks_per_seq + begin / BS;
  const int64_t head_elems = static_cast<int64_t>(D) * BS;
  const int64_t block_elems = head_elems * in.num_kv_heads;

  Scratch& sc = tls_scratch;
  sc.query_pattern.resize(static_cast<size_t>(G) * DX * ROW);
  sc.logits.resize(static_cast<size_t>(G) * logits_stride);
  sc.acc.resize(static_cast<size_t>(G) * std::max<int64_t>(ROW, head_elems));
  sc.row.resize(std::max(ROW, BS));
  float* __restrict qp = sc.query_pattern.data();
  float* __restrict logits = sc.logits.data();
  float* __restrict acc = sc.acc.data();
  float* __restrict row = sc.row.data();

  // The scaled query laid out like a key slice (q[j*x+i] repeated for every
  // token t), so q.k for a whole block is one flat multiply-add over ROW floats.
  for (int g = 0; g < G; ++g) {
    const T* q = in.query + (static_cast<int64_t>(seq) * in.num_heads + kv_head * G + g) * D;
    for (int j = 0; j < DX; ++j)
      for (int t = 0; t < BS; ++t)
        for (int i = 0; i < X; ++i) qp[(g * DX + j) * ROW + t * X + i] = to_float(q[j * X + i]) * in.scale;
  }

  // Pass 1: logits. acc[g][t*x+i] sums q*k over the head_size/x slices; the x
  // partial sums of each token are added at the end of the block.
  for (int b = 0; b < num_blocks; ++b) {
    const C* kb = in.key_cache + table[b] * block_elems + kv_head * head_elems;
    const C* next = b + 1 < num_blocks ? in.key_cache + table[b + 1] * block_elems + kv_head * head_elems : nullptr;
    std::fill(acc, acc + G * ROW, 0.0f);
    for (int j = 0; j < DX; ++j) {
      if (next) {
        // Blocks are scattered in memory, so the hardware prefetcher cannot
        // guess the next one; fetch it one slice at a time while we compute.
        for (int c = 0; c < ROW * static_cast<int>(sizeof(C)); c += 64) __builtin_prefetch(reinterpret_cast<const char*>(next + j * ROW) + c);
      }
      const float* k;
      if constexpr (std::is_same_v<C, float>) {
        k = kb + j * ROW;
      } else {
        load_floats(kb + j * ROW, row, ROW);
        k = row;
      }
      for (int g = 0; g < G; ++g) multiply_add<ROW>(acc + g * ROW, qp + (g * DX + j) * ROW, k);
    }
    for (int g = 0; g < G; ++g)
      for (int t = 0; t < BS; ++t) {
        float s = 0.0f;
        for (int i = 0; i < X; ++i) s += acc[g * ROW + t * X + i];
        logits[g * logits_stride + b * BS + t] = s;
      }
  }

  // Softmax per head over the valid tokens; slots past the end (the unused
  // tail of the last block) get probability 0.
  for (int g = 0; g < G; ++g) {
    float* l = logits + g * logits_stride;
    float m = -std::numeric_limits<float>::infinity();
    for (int t = 0; t < span; ++t) m = std::max(m, l[t]);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int t = 0; t < span; ++t) {
      l[t] = vector_exp(l[t] - m);
      sum += l[t];
    }
    for (int t = span; t < logits_stride; ++t) l[t] = 0.0f;
    span_max[g] = m;
    span_sum[g] = sum;
  }

  // Pass 2: acc[g][d][t] += p[t] * v[d][t]; summed over t at the end, so the
  // inner loop runs over the contiguous token dimension of a value row.
  std::fill(acc, acc + G * head_elems, 0.0f);
  for (int b = 0; b < num_blocks; ++b) {
    const C* vb = in.value_cache + table[b] * block_elems + kv_head * head_elems;
    const C* next = b + 1 < num_blocks ? in.value_cache + table[b + 1] * block_elems + kv_head * head_elems : nullptr;
    const int valid = std::min(BS, span - b * BS);
    for (int d = 0; d < D; ++d) {
      if (next && (d * BS * static_cast<int>(sizeof(C))) % 64 == 0) __builtin_prefetch(next + d * BS);
      const float* v;
      if constexpr (std::is_same_v<C, float>) {
        v = vb + d * BS;
      } else {
        load_floats(vb + d * BS, row, BS);
        v = row;
      }
      if (valid == BS) {
        for (int g = 0; g < G; ++g) multiply_add<BS>(acc + (g * D + d) * BS, logits + g * logits_stride + b * BS, v);
      } else {
        // The tail of the last block holds stale or uninitialized values
        // (possibly NaN), so those tokens are skipped, not multiplied by 0.
        for (int g = 0; g < G; ++g) {
          float* a = acc + (g * D + d) * BS;
          const float* p = logits + g * logits_stride + b * BS;
          for (int t = 0; t < valid; ++t) a[t] += p[t] * v[t];
        }
      }
    }
  }
  for (int g = 0; g < G; ++g) {
    const float inv = in.value_scale / span_sum[g];
    for (int d = 0; d < D; ++d) {
      const float* a = acc + (g * D + d) * BS;
      float s = 0.0f;
      for (int t = 0; t < BS; ++t) s += a[t];
      out[g * D + d] = s * inv;
    }
  }
}

template <typename T, typename C>
AttentionInputs<T, C> make_inputs(const at::Tensor& query, const at::Tensor& key_cache, const at::Tensor& value_cache,
                                  int64_t num_kv_heads, double scale, const at::Tensor& block_tables,
                                  const at::Tensor& seq_lens, const std::optional<at::Tensor>& sinks,
                                  double k_scale, double v_scale) {
  AttentionInputs<T, C> in;
  in.query = query.data_ptr<T>();
  in.key_cache = static_cast<const C*>(key_cache.data_ptr());
  in.value_cache = static_cast<const C*>(value_cache.data_ptr());
  in.block_tables = block_tables.data_ptr<int32_t>();
  in.seq_lens = seq_lens.data_ptr<int32_t>();
  in.sinks = sinks.has_value() ? sinks->data_ptr<float>() : nullptr;
  in.num_heads = static_cast<int>(query.size(1));
  in.num_kv_heads = static_cast<int>(num_kv_heads);
  in.group = in.num_heads / in.num_kv_heads;
  in.head_size = static_cast<int>(query.size(2));
  in.max_blocks_per_seq = static_cast<int>(block_tables.size(1));
  in.scale = static_cast<float>(scale * k_scale);
  in.value_scale = static_cast<float>(v_scale);
  return in;
}

// Below this many multiply-adds (~0.1 ms on one core) a call runs on one
// thread: waking a thread team costs tens of microseconds, and milliseconds
// when other processes hold the cores.
constexpr int64_t kMinParallelWork = int64_t{1} << 21;

// Total multiply-adds of a call: q.k and p.v for every head and token.
template <typename T, typename C>
int64_t attention_work(const AttentionInputs<T, C>& in, int num_seqs) {
  int64_t tokens = 0;
  for (int s = 0; s < num_seqs; ++s) tokens += in.seq_lens[s];
  return 2 * tokens * in.num_heads * in.head_size;
}

// Runs body(item) for item in [0, n) on torch's intra-op thread count.
// Dynamic scheduling because sequences have ragged lengths.
template <typename F>
void parallel_items(int64_t n, int64_t work, const F& body) {
  const int threads = work < kMinParallelWork ? 1 : std::max(1, std::min<int>(at::get_num_threads(), static_cast<int>(n)));
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
  for (int64_t item = 0; item < n; ++item) body(item);
}

template <typename T, typename C, int BS>
void run_v1(at::Tensor& out, const AttentionInputs<T, C>& in, int num_seqs) {
  T* out_ptr = out.data_ptr<T>();
  const int G = in.group, D = in.head_size;
  const int64_t work = attention_work(in, num_seqs);
  parallel_items(static_cast<int64_t>(num_seqs) * in.num_kv_heads, work, [&](int64_t item) {
    const int seq = static_cast<int>(item / in.num_kv_heads);
    const int kv_head = static_cast<int>(item % in.num_kv_heads);
    T* dst = out_ptr + (static_cast<int64_t>(seq) * in.num_heads + kv_head * G) * D;
    const int len = in.seq_lens[seq];
    if (len == 0) {
      for (int e = 0; e < G * D; ++e) dst[e] = from_float<T>(0.0f);
      return;
    }
    std::vector<float> result(static_cast<size_t>(G) * D), maxes(G), sums(G);
    attend_span<T, C, BS>(in, seq, kv_head, 0, len, result.data(), maxes.data(), sums.data());
    if (in.sinks) {
      // std::exp, not vector_exp: sink - max may be positive (even > 88, where
      // the factor correctly goes to 0).
      for (int g = 0; g < G; ++g) {
        const float factor = sums[g] / (sums[g] + std::exp(in.sinks[kv_head * G + g] - maxes[g]));
        for (int d = 0; d < D; ++d) result[g * D + d] *= factor;
      }
    }
    for (int e = 0; e < G * D; ++e) dst[e] = from_float<T>(result[e]);
  });
}

template <typename T, typename C, int BS>
void run_v2(at::Tensor& out, const AttentionInputs<T, C>& in, int num_seqs) {
  const int G = in.group, D = in.head_size, H = in.num_heads;
  int longest = 0;
  for (int s = 0; s < num_seqs; ++s) longest = std::max(longest, static_cast<int>(in.seq_lens[s]));
  const int P = std::max(1, (longest + kPartitionSize - 1) / kPartitionSize);
  // Workspace: per (seq, head, partition) max logit, exp-sum and normalized output.
  std::vector<float> part_max(static_cast<size_t>(num_seqs) * H * P);
  std::vector<float> part_sum(part_max.size());
  std::vector<float> part_out(part_max.size() * D);

  const int64_t work = attention_work(in, num_seqs);
  parallel_items(static_cast<int64_t>(num_seqs) * in.num_kv_heads * P, work, [&](int64_t item) {
    const int part = static_cast<int>(item % P);
    const int kv_head = static_cast<int>((item / P) % in.num_kv_heads);
    const int seq = static_cast<int>(item / (static_cast<int64_t>(P) * in.num_kv_heads));
    const int len = in.seq_lens[seq];
    const int begin = part * kPartitionSize;
    if (begin >= len) return;
    const int end = std::min(len, begin + kPartitionSize);
    std::vector<float> result(static_cast<size_t>(G) * D), maxes(G), sums(G);
    attend_span<T, C, BS>(in, seq, kv_head, begin, end, result.data(), maxes.data(), sums.data());
    for (int g = 0; g < G; ++g) {
      const int64_t slot = (static_cast<int64_t>(seq) * H + kv_head * G + g) * P + part;
      part_max[slot] = maxes[g];
      part_sum[slot] = sums[g];
      std::copy(result.begin() + g * D, result.begin() + (g + 1) * D, part_out.begin() + slot * D);
    }
  });

  // Reduction: rescale each partition's sum to the global max; the output is
  // the sum-weighted mean of the partitions' normalized outputs.
  T* out_ptr = out.data_ptr<T>();
  parallel_items(static_cast<int64_t>(num_seqs) * H, static_cast<int64_t>(num_seqs) * H * P * D, [&](int64_t item) {
    const int seq = static_cast<int>(item / H);
    const int len = in.seq_lens[seq];
    T* dst = out_ptr + item * D;
    const int parts = (len + kPartitionSize - 1) / kPartitionSize;
    if (parts == 0) {
      for (int d = 0; d < D; ++d) dst[d] = from_float<T>(0.0f);
      return;
    }
    const int64_t first = item * P;
    float global_max = -std::numeric_limits<float>::infinity();
    for (int p = 0; p < parts; ++p) global_max = std::max(global_max, part_max[first + p]);
    std::vector<float> acc(D, 0.0f);
    float total = 0.0f;
    for (int p = 0; p < parts; ++p) {
      const float w = part_sum[first + p] * std::exp(part_max[first + p] - global_max);
      total += w;
      const float* src = part_out.data() + (first + p) * D;
      for (int d = 0; d < D; ++d) acc[d] += w * src[d];
    }
    if (in.sinks) total += std::exp(in.sinks[item % H] - global_max);
    const float inv = 1.0f / total;
    for (int d = 0; d < D; ++d) dst[d] = from_float<T>(acc[d] * inv);
  });
}

// Calls f(std::integral_constant<int, BS>) so BS is a compile-time loop bound.
template <typename F>
void dispatch_block_size(int64_t block_size, const F& f) {
  switch (block_size) {
    case 8: f(std::integral_constant<int, 8>{}); break;
    case 16: f(std::integral_constant<int, 16>{}); break;
    case 32: f(std::integral_constant<int, 32>{}); break;
    default: TORCH_CHECK(false, "paged_attention: unsupported block_size ", block_size, " (8, 16 or 32)");
  }
}

void check_common(const at::Tensor& query, const at::Tensor& key_cache, int64_t num_kv_heads,
                  const std::optional<at::Tensor>& sinks) {
  TORCH_CHECK(query.device().is_cpu() && key_cache.device().is_cpu(), "paged_attention (cpu): tensors must be on the CPU");
  TORCH_CHECK(query.is_contiguous() && key_cache.is_contiguous(), "paged_attention (cpu): query and caches must be contiguous");
  TORCH_CHECK(num_kv_heads > 0 && query.size(1) % num_kv_heads == 0, "paged_attention: num_heads must be a multiple of num_kv_heads");
  TORCH_CHECK(key_cache.scalar_type() == query.scalar_type() || key_cache.scalar_type() == at::kFloat8_e4m3fn,
              "paged_attention (cpu): the caches must have the query's dtype or be float8_e4m3fn");
  if (sinks.has_value()) {
    TORCH_CHECK(sinks->device().is_cpu() && sinks->is_contiguous() && sinks->scalar_type() == at::kFloat &&
                    sinks->dim() == 1 && sinks->size(0) == query.size(1),
                "paged_attention (cpu): sinks must be a contiguous float32 CPU tensor [num_heads]");
  }
}

// Runs v1 (partitioned = false) or v2 for query type T over a cache of T or of FP8.
template <typename T>
void dispatch_cache(at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
                    const at::Tensor& value_cache, int64_t num_kv_heads, double scale, const at::Tensor& block_tables,
                    const at::Tensor& seq_lens, int64_t block_size, const std::optional<at::Tensor>& sinks,
                    double k_scale, double v_scale, bool partitioned) {
  auto run = [&](auto cache_tag) {
    using C = decltype(cache_tag);
    auto in = make_inputs<T, C>(query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens, sinks,
                                k_scale, v_scale);
    const int num_seqs = static_cast<int>(query.size(0));
    dispatch_block_size(block_size, [&](auto bs) {
      if (partitioned) run_v2<T, C, decltype(bs)::value>(out, in, num_seqs);
      else run_v1<T, C, decltype(bs)::value>(out, in, num_seqs);
    });
  };
  if (key_cache.scalar_type() == at::kFloat8_e4m3fn) run(Fp8E4M3{});
  else run(T{});
}

}  // namespace

void paged_attention_v1(at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
                        const at::Tensor& value_cache, int64_t num_kv_heads, double scale,
                        const at::Tensor& block_tables, const at::Tensor& seq_lens, int64_t block_size,
                        int64_t max_seq_len, const std::optional<at::Tensor>& sinks, double k_scale, double v_scale) {
  (void)max_seq_len;  // scratch is sized from the actual lengths on the CPU
  check_common(query, key_cache, num_kv_heads, sinks);
  PAGED_CPU_DISPATCH(query.scalar_type(), "paged_attention_v1", [&] {
    dispatch_cache<scalar_t>(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens,
                             block_size, sinks, k_scale, v_scale, false);
  });
}

void paged_attention_v2(at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
                        const at::Tensor& value_cache, int64_t num_kv_heads, double scale,
                        const at::Tensor& block_tables, const at::Tensor& seq_lens, int64_t block_size,
                        int64_t max_seq_len, const std::optional<at::Tensor>& sinks, double k_scale, double v_scale) {
  (void)max_seq_len;  // as in v1; the partition count comes from the actual lengths
  check_common(query, key_cache, num_kv_heads, sinks);
  PAGED_CPU_DISPATCH(query.scalar_type(), "paged_attention_v2", [&] {
    dispatch_cache<scalar_t>(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens,
                             block_size, sinks, k_scale, v_scale, true);
  });
}

}  // namespace paged_cpu
