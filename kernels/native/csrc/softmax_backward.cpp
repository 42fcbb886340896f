// softmax_backward over a rows x cols matrix: dx = y * (g - s), s = sum(g * y) per row, from the
// forward's output y and the gradient g; tile_rows x tile_cols tiles, two input queues (y, g).
//
// Row tiles are split over the cores in contiguous ranges; float32 accumulation of s whatever the
// dtype; AVX-512 where the CPU has it (float, bfloat16, half), vectorised loops otherwise.
// pipeline_depth d: the copy-in of step i + d - 1 is issued as prefetches before step i.
//
// A row tile whose tiles span the whole row (tile_cols >= cols) is one step, and its rows are
// consumed where they lie: s from y and g in global memory, then dx from them again (by then in
// L1/L2: the cache lines the first read brought in are the tile's local copy). Copying whole rows
// into slots first cost 15-20% here (the extra store stream doubles a long row's footprint in L1
// and competes with the loads), so whole-row tiles use no slots and buffer_num does not change
// them. Otherwise a row tile takes two passes over its column tiles: pass one accumulates s per
// row from global memory, pass two copies each column tile of y and g in again, into slot
// i % buffer_num of their queues, and produces dx from the slots. Copy-out is fused with compute:
// dx is written straight to global memory (streaming stores when it is larger than the caches);
// there is no output slot.
#include "native.h"

namespace {

using tiletune::Pipeline;
using tiletune::RowTiling;
using Block = tiletune::RowBlock;

#if defined(__AVX512F__)
// T has 16-lane AVX-512 loads and stores here (double takes the portable loops).
template <class T>
constexpr bool kVector = std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16> ||
                         std::is_same_v<T, c10::Half>;

inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
}

// 16 bfloat16 lanes as float32 (exact: bfloat16 is float32's upper half).
inline __m512 bf16_to_float(__m256i bits) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// Up to 16 lanes of T as float32 (lanes off the mask are 0).
inline __m512 load16(const float* v, __mmask16 k) { return _mm512_maskz_loadu_ps(k, v); }
inline __m512 load16(const c10::BFloat16* v, __mmask16 k) {
  return bf16_to_float(_mm256_maskz_loadu_epi16(k, v));
}
inline __m512 load16(const c10::Half* v, __mmask16 k) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, v));
}

// Up to 16 float32 lanes stored as T, rounded to nearest even (as c10's conversions round).
inline void store16(float* v, __mmask16 k, __m512 x) { _mm512_mask_storeu_ps(v, k, x); }
inline void store16(c10::Half* v, __mmask16 k, __m512 x) {
  _mm256_mask_storeu_epi16(v, k, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
inline void store16(c10::BFloat16* v, __mmask16 k, __m512 x) {
#if defined(__AVX512BF16__)
  _mm256_mask_storeu_epi16(v, k, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)));
#else
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, x);
  for (int j = 0; j < 16; ++j)
    if (k >> j & 1) v[j] = c10::BFloat16(lanes[j]);
#endif
}

#endif

// sum(g * y) over n elements, accumulated in float32.
template <class T>
float dot(const T* __restrict__ y, const T* __restrict__ g, int64_t n) {
#if defined(__AVX512F__)
  if constexpr (kVector<T>) {
    const __mmask16 all = 0xFFFF;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
      acc0 = _mm512_fmadd_ps(load16(y + i, all), load16(g + i, all), acc0);
      acc1 = _mm512_fmadd_ps(load16(y + i + 16, all), load16(g + i + 16, all), acc1);
    }
    for (; i < n; i += 16) {
      const __mmask16 k = tail_mask(n - i);
      acc0 = _mm512_fmadd_ps(load16(y + i, k), load16(g + i, k), acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  }
#endif
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += tiletune::to_float(y[i]) * tiletune::to_float(g[i]);
  return s;
}

// dx[i] = y[i] * (g[i] - s) for i in [0, n), stored in T: compute fused with copy-out (float32 streamed past the caches when `stream`).
template <class T>
void write_gradient(T* __restrict__ dx, const T* __restrict__ y, const T* __restrict__ g, float s,
                    int64_t n, bool stream) {
#if defined(__AVX512F__)
  if constexpr (kVector<T>) {
    const __m512 vs = _mm512_set1_ps(s);
    int64_t i = 0;
    if constexpr (std::is_same_v<T, float>) {
      if (stream) {
        for (; i < n && (reinterpret_cast<uintptr_t>(dx + i) & 63) != 0; ++i) dx[i] = y[i] * (g[i] - s);
        for (; i + 16 <= n; i += 16)
          _mm512_stream_ps(dx + i, _mm512_mul_ps(_mm512_loadu_ps(y + i),
                                                 _mm512_sub_ps(_mm512_loadu_ps(g + i), vs)));
      }
    }
    for (; i < n; i += 16) {
      const __mmask16 k = tail_mask(n - i);
      store16(dx + i, k, _mm512_mul_ps(load16(y + i, k), _mm512_sub_ps(load16(g + i, k), vs)));
    }
    return;
  }
#endif
  tiletune::store_each(dx, n, stream, [&](int64_t i) {
    return tiletune::to_float(y[i]) * (tiletune::to_float(g[i]) - s);
  });
}

// Local memory of one core: the row sums (float32) and, for column tiles, buffer_num slots of y
// and of g.
template <class T>
struct BackwardLocal {
  T* y;
  T* g;
  float* sums;
  int64_t tile;

  BackwardLocal(const RowTiling& t, int64_t slots) {
    tile = t.tile_rows * t.tile_cols;
    auto round = [](size_t bytes) { return (bytes + 63) / 64 * 64; };
    const size_t queue = t.two_pass ? round(slots * tile * sizeof(T)) : 0;
    char* base = static_cast<char*>(tiletune::local_memory(2 * queue + round(t.tile_rows * sizeof(float))));
    sums = reinterpret_cast<float*>(base);
    y = reinterpret_cast<T*>(base + round(t.tile_rows * sizeof(float)));
    g = reinterpret_cast<T*>(base + round(t.tile_rows * sizeof(float)) + queue);
  }
};

template <class T>
void prefetch_block(const T* v, int64_t ld, const Block& b) {
  for (int64_t r = 0; r < b.rows; ++r) tiletune::prefetch(v + (b.r0 + r) * ld + b.c0, b.cols * sizeof(T));
}

template <class T>
void softmax_backward_core(const T* y, const T* g, T* dx, const RowTiling& t, const Pipeline& p,
                           int64_t core) {
  auto [first, last] = tiletune::core_range(t.row_tiles(), p.block_dim, core);
  if (first >= last) return;
  BackwardLocal<T> local(t, p.buffer_num);
  const bool stream = static_cast<size_t>(t.rows * t.cols) * sizeof(T) > tiletune::streaming_bytes();
  const int64_t spt = t.steps_per_tile(), total = (last - first) * spt;
  auto block_of = [&](int64_t i) { return t.block(first + i / spt, i % spt); };
  for (int64_t i = 0; i < total; ++i) {
    const int64_t ahead = i + p.pipeline_depth - 1;
    if (ahead > i && ahead < total) {  // the copy-in of a later step, issued ahead
      const Block later = block_of(ahead);
      prefetch_block(y, t.cols, later);
      prefetch_block(g, t.cols, later);
    }
    const Block b = block_of(i);
    const int64_t slot = i % p.buffer_num;
    for (int64_t r = 0; r < b.rows; ++r) {
      const int64_t at = (b.r0 + r) * t.cols + b.c0;
      if (!t.two_pass) {  // a whole row: s, then dx, both from the row in place
        const float s = dot(y + at, g + at, b.cols);
        write_gradient(dx + at, y + at, g + at, s, b.cols, stream);
      } else if (!b.second) {  // pass one: fold this column tile into s
        const float part = dot(y + at, g + at, b.cols);
        local.sums[r] = b.first ? part : local.sums[r] + part;
      } else {  // pass two: copy-in of the column tile into the slots, dx from them
        T* ys = local.y + slot * local.tile + r * b.cols;
        T* gs = local.g + slot * local.tile + r * b.cols;
        std::memcpy(ys, y + at, b.cols * sizeof(T));
        std::memcpy(gs, g + at, b.cols * sizeof(T));
        write_gradient(dx + at, ys, gs, local.sums[r], b.cols, stream);
      }
    }
  }
  if (stream) tiletune::stream_fence();
}

}  // namespace

at::Tensor native_softmax_backward(const at::Tensor& y, const at::Tensor& grad, int64_t tile_rows,
                                   int64_t tile_cols, int64_t block_dim, int64_t buffer_num,
                                   int64_t pipeline_depth) {
  Pipeline p{block_dim, buffer_num, pipeline_depth};
  tiletune::check_input(y, "y");
  tiletune::check_input(grad, "grad");
  TORCH_CHECK(y.dim() == 2, "y must be rows x cols");
  TORCH_CHECK(grad.sizes() == y.sizes() && grad.scalar_type() == y.scalar_type(),
              "grad must have y's size and dtype");
  TORCH_CHECK(tile_rows >= 1 && tile_cols >= 1, "tile_rows and tile_cols must be >= 1");
  tiletune::check_pipeline(p);
  auto dx = at::empty_like(y);
  if (y.numel() == 0) return dx;
  const RowTiling t(y.size(0), y.size(1), tile_rows, tile_cols);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, y.scalar_type(), "native_softmax_backward", [&] {
    const scalar_t* py = y.data_ptr<scalar_t>();
    const scalar_t* pg = grad.data_ptr<scalar_t>();
    scalar_t* pdx = dx.data_ptr<scalar_t>();
    tiletune::for_each_core(p.block_dim, [&](int64_t core) { softmax_backward_core(py, pg, pdx, t, p, core); });
  });
  return dx;
}
