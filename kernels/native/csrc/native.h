// What every tiletune native CPU kernel shares: the Ascend-C-shaped execution model on a CPU.
//
// - block_dim "cores": the kernel's tiles are spread over block_dim workers of torch's own
//   intra-op thread pool (at::parallel_for, the pool torch's ops use); 1 runs on the caller.
// - each core owns its local memory (thread-local, 64-byte aligned, reused across calls):
//   buffer_num slots of one tile per queue; tile i of a core uses slot i % buffer_num.
// - per tile: copy-in (global -> slot), compute (slots only), copy-out (slot -> global).
// - pipeline_depth d: before the copy-in of a core's tile i, the copy-in of tile i + d - 1
//   is issued as software prefetches of its global memory (1: no prefetch).
// - MKL calls inside a core are single-threaded (the cores are the parallelism).
// - where the output needs no staging, copy-out is fused with compute: compute reads the
//   input slots and writes global memory directly (streaming stores where the output is
//   larger than the caches), instead of filling an output slot and copying it out.
#pragma once

// Light ATen headers only (the Python binding TU alone includes pybind11): compile time matters,
// since `make setup` builds this on every fresh machine.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <tuple>

#include <unistd.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
            const float* beta, float* c, const int* ldc);
int MKL_Set_Num_Threads_Local(int nt);  // the C interface (lowercase is Fortran: by pointer)
}

namespace tiletune {

struct Pipeline {
  int64_t block_dim;
  int64_t buffer_num;
  int64_t pipeline_depth;
};

inline void check_pipeline(const Pipeline& p) {
  TORCH_CHECK(p.block_dim >= 1, "block_dim must be >= 1, got ", p.block_dim);
  TORCH_CHECK(p.buffer_num >= 1, "buffer_num must be >= 1, got ", p.buffer_num);
  TORCH_CHECK(p.pipeline_depth >= 1, "pipeline_depth must be >= 1, got ", p.pipeline_depth);
}

inline void check_input(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, ": native kernels run on CPU tensors, got ", t.device());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

// MKL single-threaded on this thread for the scope (restores the previous local setting).
class SingleThreadedBlas {
 public:
  SingleThreadedBlas() : previous_(MKL_Set_Num_Threads_Local(1)) {}
  ~SingleThreadedBlas() { MKL_Set_Num_Threads_Local(previous_); }
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  int previous_;
};

// Run body(core) for core in [0, block_dim) on torch's thread pool; block_dim 1 runs on the
// caller and starts no parallel region. `Blas`: the body calls MKL (made single-threaded on
// each core for the call); kernels without BLAS skip that per-call cost.
template <bool Blas = false, class Body>
void for_each_core(int64_t block_dim, const Body& body) {
  if (block_dim == 1) {
    if constexpr (Blas) {
      SingleThreadedBlas one;
      body(0);
    } else {
      body(0);
    }
    return;
  }
  at::parallel_for(0, block_dim, 1, [&](int64_t begin, int64_t end) {
    if constexpr (Blas) {
      SingleThreadedBlas one;
      for (int64_t core = begin; core < end; ++core) body(core);
    } else {
      for (int64_t core = begin; core < end; ++core) body(core);
    }
  });
}

// Outputs larger than the last-level cache are written with streaming (non-temporal) stores:
// they cannot stay cached and would only evict the inputs. Smaller ones are stored normally
// (the next reader, often the next call, finds them in cache).
inline size_t streaming_bytes() {
  static const size_t bytes = [] {
    const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    return llc > 0 ? static_cast<size_t>(llc) : size_t{32} << 20;
  }();
  return bytes;
}

// dst[i] = f(i) for i in [0, n), float32 results; with `stream` (and AVX-512) the aligned middle
// is written with non-temporal stores (the caller issues stream_fence() before returning).
template <class T, class F>
inline void store_each(T* __restrict__ dst, int64_t n, bool stream, const F& f) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    if (stream) {
      int64_t i = 0;
      for (; i < n && (reinterpret_cast<uintptr_t>(dst + i) & 63) != 0; ++i) dst[i] = f(i);
      for (; i + 16 <= n; i += 16) {
        alignas(64) float v[16];
#pragma omp simd
        for (int j = 0; j < 16; ++j) v[j] = f(i + j);
        _mm512_stream_ps(dst + i, _mm512_load_ps(v));
      }
      for (; i < n; ++i) dst[i] = f(i);
      return;
    }
  }
#endif
  (void)stream;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(f(i));
}

// Orders this thread's streaming stores before whatever follows (a no-op without them).
inline void stream_fence() {
#if defined(__AVX512F__)
  _mm_sfence();
#endif
}

// The contiguous range of `count` items core `core` of `cores` owns.
inline std::pair<int64_t, int64_t> core_range(int64_t count, int64_t cores, int64_t core) {
  int64_t base = count / cores, extra = count % cores;
  int64_t begin = core * base + std::min(core, extra);
  return {begin, begin + base + (core < extra ? 1 : 0)};
}

// This thread's local memory: at least `bytes`, 64-byte aligned, kept for later calls.
inline void* local_memory(size_t bytes) {
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  thread_local std::unique_ptr<void, Free> memory;
  thread_local size_t capacity = 0;
  if (bytes > capacity) {
    size_t rounded = (bytes + 63) / 64 * 64;
    memory.reset(std::aligned_alloc(64, rounded));
    TORCH_CHECK(memory, "cannot allocate ", rounded, " bytes of local memory");
    capacity = rounded;
  }
  return memory.get();
}

// Issue the copy-in of [p, p + bytes) ahead: software prefetch of its cache lines.
inline void prefetch(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 0, 3);
}

template <class T>
inline float to_float(T v) {
  return static_cast<float>(v);
}

// exp(x) for float32: 2^n * e^r with |r| <= ln2/2, a degree-6 polynomial for e^r;
// relative error ~1e-7; inputs below -87 (their exp is under float's smallest normal), -inf of a
// masked entry among them, give exactly 0 (a select, so loops calling it still vectorise).
inline float exp_approx(float x) {
  const bool underflow = x < -87.0f;
  x = std::min(std::max(x, -87.0f), 88.0f);
  float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = std::fma(n, -0.693359375f, x);
  r = std::fma(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p, r * r, r) + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return underflow ? 0.0f : p * scale;
}

#if defined(__AVX512F__)
// exp of 16 float32 lanes: n = round(x log2 e), r = x - n ln2 (two-part ln2), the same degree-6
// polynomial as exp_approx for e^r, then 2^n applied by vscalefps (no exponent-bit tricks,
// saturates to 0 / inf outside the float range; x = -inf gives 0).
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));  // below: 0 after scaling; keeps -inf finite
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
  p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}
#endif

// e[i] = exp(v[i] - shift) for i in [0, n) (e may be v, or null: sums only); returns the sum.
// Float32 throughout; AVX-512 where the CPU has it (masked tail), exp_approx otherwise.
inline float exp_shift_sum(const float* v, float shift, float* e, int64_t n) {
#if defined(__AVX512F__)
  const __m512 s = _mm512_set1_ps(shift);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 e0 = exp16(_mm512_sub_ps(_mm512_loadu_ps(v + i), s));
    const __m512 e1 = exp16(_mm512_sub_ps(_mm512_loadu_ps(v + i + 16), s));
    if (e) {
      _mm512_storeu_ps(e + i, e0);
      _mm512_storeu_ps(e + i + 16, e1);
    }
    acc0 = _mm512_add_ps(acc0, e0);
    acc1 = _mm512_add_ps(acc1, e1);
  }
  for (; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    const __m512 e0 = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, v + i), s));
    if (e) _mm512_mask_storeu_ps(e + i, k, e0);
    acc0 = _mm512_add_ps(acc0, _mm512_maskz_mov_ps(k, e0));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#else
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float x = exp_approx(v[i] - shift);
    if (e) e[i] = x;
    sum += x;
  }
  return sum;
#endif
}

// The largest of v[0..n) (-inf for n == 0): 16 partial maxima, so it vectorises.
template <class T>
inline float max_of(const T* v, int64_t n) {
  constexpr int lanes = 16;
  float part[lanes];
  for (int j = 0; j < lanes; ++j) part[j] = -INFINITY;
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    for (int j = 0; j < lanes; ++j) {
      const float x = to_float(v[i + j]);
      part[j] = part[j] > x ? part[j] : x;
    }
  }
  float m = -INFINITY;
  for (int j = 0; j < lanes; ++j) m = m > part[j] ? m : part[j];
  for (; i < n; ++i) m = std::max(m, to_float(v[i]));
  return m;
}

// Copy v[0..n) to dst (the copy-in of one row) and return the largest element (-inf for n == 0):
// the max of a row comes with its copy-in instead of another pass over the slot.
template <class T>
inline float copy_max(T* __restrict__ dst, const T* __restrict__ v, int64_t n) {
  constexpr int lanes = 16;
  float part[lanes];
  for (int j = 0; j < lanes; ++j) part[j] = -INFINITY;
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    for (int j = 0; j < lanes; ++j) {
      const T e = v[i + j];
      dst[i + j] = e;
      const float x = to_float(e);
      part[j] = part[j] > x ? part[j] : x;
    }
  }
  float m = -INFINITY;
  for (int j = 0; j < lanes; ++j) m = m > part[j] ? m : part[j];
  for (; i < n; ++i) {
    dst[i] = v[i];
    m = std::max(m, to_float(v[i]));
  }
  return m;
}

// Copy `count` elements of T into float32 (memcpy when T is float).
template <class T>
inline void load_float(float* dst, const T* src, int64_t count) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, count * sizeof(float));
  } else {
#pragma omp simd
    for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<float>(src[i]);
  }
}

template <class T>
inline void store_from_float(T* dst, const float* src, int64_t count) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, count * sizeof(float));
  } else {
#pragma omp simd
    for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<T>(src[i]);
  }
}

// Row-major C[m, n] (ld ldc) = A[m, k] (ld lda) @ B[k, n] (ld ldb) + beta * C, via Fortran sgemm_.
// `trans_a`: A is given as row-major [k, m] (ld lda) and used transposed; `trans_b`: B is given
// as row-major [n, k] (ld ldb) and used transposed.
inline void gemm_rowmajor(int m, int n, int k, const float* a, int lda, bool trans_a, const float* b,
                          int ldb, bool trans_b, float beta, float* c, int ldc) {
  const float one = 1.0f;
  // Row-major C = A B  <=>  column-major C^T = B^T A^T.
  const char tb = trans_b ? 'T' : 'N';
  const char ta = trans_a ? 'T' : 'N';
  sgemm_(&tb, &ta, &n, &m, &k, &one, b, &ldb, a, &lda, &beta, c, &ldc);
}

// The same with A row-major [m, k] (not transposed).
inline void gemm_rowmajor(int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                          bool trans_b, float beta, float* c, int ldc) {
  gemm_rowmajor(m, n, k, a, lda, false, b, ldb, trans_b, beta, c, ldc);
}

// One step of a row tile of the row-wise kernels: rows [r0, r0 + rows) by columns [c0, c0 + cols).
struct RowBlock {
  int64_t r0, rows, c0, cols;
  bool second;  // a pass-two (output-producing) step
  bool first;   // the first step of its pass
};

// The row-wise kernels' tiling of a rows x cols matrix into tile_rows x tile_cols tiles: a row tile is
// one step with whole rows, else two passes over its column tiles (statistics, then the output).
struct RowTiling {
  int64_t rows, cols, tile_rows, tile_cols, col_tiles;
  bool two_pass;

  RowTiling(int64_t r, int64_t c, int64_t tr, int64_t tc)
      : rows(r), cols(c), tile_rows(tr), tile_cols(std::min(tc, c)),
        col_tiles((c + std::min(tc, c) - 1) / std::min(tc, c)), two_pass(col_tiles > 1) {}

  int64_t row_tiles() const { return (rows + tile_rows - 1) / tile_rows; }
  int64_t steps_per_tile() const { return two_pass ? 2 * col_tiles : 1; }

  RowBlock block(int64_t row_tile, int64_t step) const {
    const int64_t r0 = row_tile * tile_rows;
    const bool second = !two_pass || step >= col_tiles;
    const int64_t ct = two_pass ? step % col_tiles : 0;
    const int64_t c0 = ct * tile_cols;
    return {r0, std::min(tile_rows, rows - r0), c0, std::min(tile_cols, cols - c0), second, ct == 0};
  }
};

// q [batch, heads, seq_q, d], k and v [batch, kv_heads, seq_kv, d]: CPU, one dtype, 4-D, kv_heads
// dividing heads (grouped-query attention); what the attention's forward and backward check first.
inline void check_attention_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  for (auto [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) {
    check_input(*t, name);
    TORCH_CHECK(t->dim() == 4, name, " must be 4-D [batch, heads, seq, head_dim], got ", t->dim(), " dims");
    TORCH_CHECK(t->scalar_type() == q.scalar_type(), name, " must have q's dtype ", q.scalar_type(),
                ", got ", t->scalar_type());
  }
  TORCH_CHECK(k.sizes() == v.sizes(), "k and v must have the same size, got ", k.sizes(), " and ", v.sizes());
  TORCH_CHECK(q.size(0) == k.size(0), "q and k differ in batch: ", q.size(0), " and ", k.size(0));
  TORCH_CHECK(q.size(3) == k.size(3), "q and k differ in head_dim: ", q.size(3), " and ", k.size(3));
  TORCH_CHECK(q.size(3) >= 1, "head_dim must be >= 1");
  TORCH_CHECK(k.size(1) >= 1 && q.size(1) % k.size(1) == 0, "heads (", q.size(1),
              ") must be a multiple of kv_heads (", k.size(1), ")");
}

// An additive attention mask over (batch, head, query, key), read through its strides; a broadcast
// dim has stride 0. `row(heads, bh, i)`: query i's row of the flat (batch, head) `bh`.
template <class T>
struct MaskView {
  const T* data;  // null: no mask
  int64_t batch, head, query, key;
  const T* row(int64_t heads, int64_t bh, int64_t i) const {
    return data + (bh / heads) * batch + (bh % heads) * head + i * query;
  }
};

// The mask's strides (a size-1 dim broadcasts: stride 0), after checking its dtype and shape.
inline std::array<int64_t, 4> mask_strides(const at::Tensor& mask, const at::Tensor& q, int64_t seq_kv) {
  TORCH_CHECK(mask.device().is_cpu(), "mask: native kernels run on CPU tensors, got ", mask.device());
  TORCH_CHECK(mask.scalar_type() == q.scalar_type(), "mask must have q's dtype ", q.scalar_type(),
              " (an additive mask), got ", mask.scalar_type());
  TORCH_CHECK(mask.dim() == 4, "mask must be 4-D [batch or 1, heads or 1, seq_q, seq_kv], got ",
              mask.dim(), " dims");
  const int64_t want[4] = {q.size(0), q.size(1), q.size(2), seq_kv};
  std::array<int64_t, 4> strides{};
  for (int64_t i = 0; i < 4; ++i) {
    TORCH_CHECK(mask.size(i) == want[i] || mask.size(i) == 1, "mask has size ", mask.sizes(),
                ", which does not broadcast to [batch, heads, seq_q, seq_kv] = ", at::IntArrayRef(want));
    strides[i] = mask.size(i) == 1 ? 0 : mask.stride(i);
  }
  return strides;
}

}  // namespace tiletune

// Kernels, defined in their own translation units and bound in module.cpp.
at::Tensor native_add(const at::Tensor& a, const at::Tensor& b, int64_t tile_size,
                         int64_t block_dim, int64_t buffer_num, int64_t pipeline_depth);
at::Tensor native_softmax(const at::Tensor& x, int64_t tile_rows, int64_t tile_cols,
                             int64_t block_dim, int64_t buffer_num, int64_t pipeline_depth);
at::Tensor native_rms_norm(const at::Tensor& x, const at::Tensor& w, double eps,
                              int64_t tile_rows, int64_t tile_cols, int64_t block_dim,
                              int64_t buffer_num, int64_t pipeline_depth);
// rms_norm's gradients for grad (x's size): (dx in x's dtype, dw = sum over rows of g x r in w's),
// with r = 1 / sqrt(mean(x^2) + eps) per row; dw accumulated in float32, per core, then summed.
std::tuple<at::Tensor, at::Tensor> native_rms_norm_backward(const at::Tensor& x, const at::Tensor& w,
                                                           const at::Tensor& grad, double eps,
                                                           int64_t tile_rows, int64_t tile_cols,
                                                           int64_t block_dim, int64_t buffer_num,
                                                           int64_t pipeline_depth);
// softmax's gradient dx = y * (g - sum(g * y)) per row of rows x cols, from the forward's output y.
at::Tensor native_softmax_backward(const at::Tensor& y, const at::Tensor& grad, int64_t tile_rows,
                                   int64_t tile_cols, int64_t block_dim, int64_t buffer_num,
                                   int64_t pipeline_depth);
at::Tensor native_matmul(const at::Tensor& a, const at::Tensor& b, int64_t tile_m,
                            int64_t tile_n, int64_t tile_k, int64_t block_dim, int64_t buffer_num,
                            int64_t pipeline_depth);
// q [batch, heads, seq_q, d], k and v [batch, kv_heads, seq_kv, d], an optional additive mask
// broadcasting to [batch, heads, seq_q, seq_kv]; causal 0 none, 1 top-left, 2 bottom-right.
// Returns (out [batch, heads, seq_q, d] in q's dtype, lse [batch, heads, seq_q] float32).
std::tuple<at::Tensor, at::Tensor> native_attention(const at::Tensor& q, const at::Tensor& k,
                                                    const at::Tensor& v,
                                                    const std::optional<at::Tensor>& mask,
                                                    int64_t causal, double scale, int64_t block_q,
                                                    int64_t block_kv, int64_t block_dim,
                                                    int64_t buffer_num, int64_t pipeline_depth);
// The gradients (dq, dk, dv) of native_attention's out for grad_out (and lse for grad_lse), from
// its inputs, out and lse (the probabilities recomputed, FlashAttention-2 style); in the inputs' dtypes.
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_attention_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& mask, const at::Tensor& out, const at::Tensor& lse,
    const at::Tensor& grad_out, const std::optional<at::Tensor>& grad_lse, int64_t causal, double scale,
    int64_t block_q, int64_t block_kv, int64_t block_dim, int64_t buffer_num, int64_t pipeline_depth);
