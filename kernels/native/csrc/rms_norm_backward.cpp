// rms_norm's gradients over a rows x cols matrix: tile_rows x tile_cols tiles.
//
// With r = 1 / sqrt(mean(x^2) + eps) per row: dx = r g w - x c, c = r^3 sum(g w x) / cols, and
// dw = sum over rows of r g x. A row tile whose tiles span the whole row (tile_cols >= cols) is one
// step: x and g are copied into their slots row by row while both row statistics (sum x^2 and
// sum g w x, float32) accumulate on the way, then the tile's dx is written and its r g x added to
// the core's float32 dw partial sums. Otherwise the row tile takes two passes over its column
// tiles, copying x, g and w's slice in again: pass one accumulates the statistics, pass two
// produces each column tile. Row tiles are split over the cores in contiguous ranges; each core
// keeps cols partial sums of dw in its local memory and copies them out at the end, and the
// partial sums are added in core order (deterministic for a given config). dx's copy-out is fused
// with compute (streaming stores when dx is larger than the caches). AVX-512 where the CPU has
// it: 16 lanes, float/half/bfloat16 widened to float32 in registers.
#include "native.h"

namespace {

using tiletune::Pipeline;
using tiletune::RowTiling;
using Block = tiletune::RowBlock;

// Whether T takes the AVX-512 path (float, half, bfloat16); double runs the scalar loops.
template <class T>
constexpr bool kVector =
#if defined(__AVX512F__)
    std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16> || std::is_same_v<T, c10::Half>;
#else
    false;
#endif

#if defined(__AVX512F__)
inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
}

// 16 elements of T: raw loads and stores (copy-in keeps the bits), widened to / narrowed from float32.
template <class T>
struct Lanes;

template <>
struct Lanes<float> {
  using Raw = __m512;
  static constexpr uintptr_t align = 64;
  static Raw load(const float* p, __mmask16 k) { return _mm512_maskz_loadu_ps(k, p); }
  static void store(float* p, Raw v, __mmask16 k) { _mm512_mask_storeu_ps(p, k, v); }
  static void stream(float* p, Raw v) { _mm512_stream_ps(p, v); }
  static __m512 widen(Raw v) { return v; }
  static Raw narrow(__m512 v) { return v; }
};

template <class T>
struct Lanes16 {  // 16-bit types: 32 bytes of raw lanes
  using Raw = __m256i;
  static constexpr uintptr_t align = 32;
  static Raw load(const T* p, __mmask16 k) { return _mm256_maskz_loadu_epi16(k, p); }
  static void store(T* p, Raw v, __mmask16 k) { _mm256_mask_storeu_epi16(p, k, v); }
  static void stream(T* p, Raw v) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), v); }
};

template <>
struct Lanes<c10::BFloat16> : Lanes16<c10::BFloat16> {
  static __m512 widen(Raw v) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16)); }
  static Raw narrow(__m512 v) {
#if defined(__AVX512BF16__)
    return (__m256i)_mm512_cvtneps_pbh(v);
#else  // round to nearest even, NaN kept quiet (as c10::BFloat16)
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7FC0));
    return _mm512_cvtepi32_epi16(rounded);
#endif
  }
};

template <>
struct Lanes<c10::Half> : Lanes16<c10::Half> {
  static __m512 widen(Raw v) { return _mm512_cvtph_ps(v); }
  static Raw narrow(__m512 v) { return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
};
#endif

#if defined(__AVX512F__)
// copy_stats on 16 lanes: the row copied as raw lanes, the sums in two float32 accumulators each.
template <class T>
std::pair<float, float> copy_stats16(T* __restrict__ xs, T* __restrict__ gs, const T* x, const T* g,
                                     const T* w, int64_t n) {
  using L = Lanes<T>;
  __m512 sq[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  __m512 gwx[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const auto xr = L::load(x + i, k), gr = L::load(g + i, k);
    L::store(xs + i, xr, k);
    L::store(gs + i, gr, k);
    const __m512 xv = L::widen(xr);
    const __m512 gw = _mm512_mul_ps(L::widen(gr), L::widen(L::load(w + i, k)));
    const int64_t a = (i >> 4) & 1;
    sq[a] = _mm512_fmadd_ps(xv, xv, sq[a]);
    gwx[a] = _mm512_fmadd_ps(gw, xv, gwx[a]);
  }
  return {_mm512_reduce_add_ps(_mm512_add_ps(sq[0], sq[1])),
          _mm512_reduce_add_ps(_mm512_add_ps(gwx[0], gwx[1]))};
}

// tile_grads on 16 lanes: per 16 columns, w and dw loaded once for the tile's rows.
template <class T>
void tile_grads16(T* dx, int64_t ld, float* __restrict__ dw, const T* xs, const T* gs, const T* w,
                  const float* r, const float* c, int64_t rows, int64_t n, bool stream) {
  using L = Lanes<T>;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 wv = L::widen(L::load(w + i, k));
    __m512 acc = _mm512_maskz_loadu_ps(k, dw + i);
    for (int64_t row = 0; row < rows; ++row) {
      const __m512 xv = L::widen(L::load(xs + row * n + i, k));
      const __m512 gv = L::widen(L::load(gs + row * n + i, k));
      const __m512 rv = _mm512_set1_ps(r[row]);
      const __m512 gwr = _mm512_mul_ps(_mm512_mul_ps(gv, wv), rv);
      const auto out = L::narrow(_mm512_fnmadd_ps(xv, _mm512_set1_ps(c[row]), gwr));
      acc = _mm512_fmadd_ps(_mm512_mul_ps(gv, xv), rv, acc);
      T* o = dx + row * ld + i;
      if (stream && k == 0xFFFF && (reinterpret_cast<uintptr_t>(o) & (L::align - 1)) == 0)
        L::stream(o, out);  // non-temporal where aligned
      else
        L::store(o, out, k);
    }
    _mm512_mask_storeu_ps(dw + i, k, acc);
  }
}
#endif

// Copy one row's x and g (n elements) into their slots; returns (sum x^2, sum g w x) in float32.
template <class T>
std::pair<float, float> copy_stats(T* __restrict__ xs, T* __restrict__ gs, const T* x, const T* g, const T* w,
                                   int64_t n) {
#if defined(__AVX512F__)
  if constexpr (kVector<T>) return copy_stats16(xs, gs, x, g, w, n);
#endif
  float sq = 0.0f, gwx = 0.0f;
#pragma omp simd reduction(+ : sq, gwx)
  for (int64_t i = 0; i < n; ++i) {
    xs[i] = x[i];
    gs[i] = g[i];
    const float xv = tiletune::to_float(x[i]);
    sq += xv * xv;
    gwx += tiletune::to_float(g[i]) * tiletune::to_float(w[i]) * xv;
  }
  return {sq, gwx};
}

// A tile's gradients from its slots (rows x n, row stride n): dx rows (stride ld) = r g w - x c,
// and dw[0..n) += sum over the tile's rows of r g x.
template <class T>
void tile_grads(T* dx, int64_t ld, float* __restrict__ dw, const T* xs, const T* gs, const T* w,
                const float* r, const float* c, int64_t rows, int64_t n, bool stream) {
#if defined(__AVX512F__)
  if constexpr (kVector<T>) return tile_grads16(dx, ld, dw, xs, gs, w, r, c, rows, n, stream);
#endif
  (void)stream;
  for (int64_t row = 0; row < rows; ++row) {
    const T* xr = xs + row * n;
    const T* gr = gs + row * n;
    T* o = dx + row * ld;
    const float rr = r[row], cr = c[row];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      const float xv = tiletune::to_float(xr[i]), gv = tiletune::to_float(gr[i]);
      o[i] = static_cast<T>(gv * tiletune::to_float(w[i]) * rr - xv * cr);
      dw[i] += gv * xv * rr;
    }
  }
}

template <class T>
void copy_block_in(T* slot, const T* x, int64_t ld, const Block& b) {
  for (int64_t r = 0; r < b.rows; ++r)
    std::memcpy(slot + r * b.cols, x + (b.r0 + r) * ld + b.c0, b.cols * sizeof(T));
}

template <class T>
void prefetch_block(const T* x, const T* g, int64_t ld, const Block& b) {
  for (int64_t r = 0; r < b.rows; ++r) {
    tiletune::prefetch(x + (b.r0 + r) * ld + b.c0, b.cols * sizeof(T));
    tiletune::prefetch(g + (b.r0 + r) * ld + b.c0, b.cols * sizeof(T));
  }
}

// Local memory of one core: buffer_num slots of x and of g; w (whole, once per call, or buffer_num
// column slots); r and c per row of a tile; the core's cols float32 partial sums of dw.
template <class T>
struct GradLocal {
  T* x;
  T* g;
  T* weight;
  float* r;
  float* c;
  float* dw;
  int64_t tile;

  GradLocal(const RowTiling& t, int64_t slots) {
    tile = t.tile_rows * t.tile_cols;
    auto round = [](size_t bytes) { return (bytes + 63) / 64 * 64; };
    const int64_t weight_elems = t.two_pass ? slots * t.tile_cols : t.cols;
    const size_t queue = round(slots * tile * sizeof(T)), w = round(weight_elems * sizeof(T));
    const size_t stats = round(2 * t.tile_rows * sizeof(float)), sums = round(t.cols * sizeof(float));
    char* base = static_cast<char*>(tiletune::local_memory(2 * queue + w + stats + sums));
    x = reinterpret_cast<T*>(base);
    g = reinterpret_cast<T*>(base + queue);
    weight = reinterpret_cast<T*>(base + 2 * queue);
    r = reinterpret_cast<float*>(base + 2 * queue + w);
    c = r + t.tile_rows;
    dw = reinterpret_cast<float*>(base + 2 * queue + w + stats);
  }
};

struct GradArgs {
  RowTiling t;
  Pipeline p;
  float eps;
  bool stream;
};

template <class T>
void grad_core(const T* x, const T* w, const T* g, T* dx, float* parts, const GradArgs& a, int64_t core) {
  const RowTiling& t = a.t;
  GradLocal<T> local(t, a.p.buffer_num);
  std::fill(local.dw, local.dw + t.cols, 0.0f);
  if (!t.two_pass) std::memcpy(local.weight, w, t.cols * sizeof(T));  // once per call
  auto [first, last] = tiletune::core_range(t.row_tiles(), a.p.block_dim, core);
  const int64_t spt = t.steps_per_tile(), total = (last - first) * spt;
  auto block_of = [&](int64_t i) { return t.block(first + i / spt, i % spt); };
  for (int64_t i = 0; i < total; ++i) {
    const int64_t ahead = i + a.p.pipeline_depth - 1;
    if (ahead > i && ahead < total) prefetch_block(x, g, t.cols, block_of(ahead));
    const Block b = block_of(i);
    const int64_t slot = i % a.p.buffer_num;
    T* xs = local.x + slot * local.tile;
    T* gs = local.g + slot * local.tile;
    const T* weight = local.weight;
    if (t.two_pass) {  // w's column slice rides its own queue
      T* ws = local.weight + slot * t.tile_cols;
      std::memcpy(ws, w + b.c0, b.cols * sizeof(T));
      weight = ws;
    }
    const int64_t at = b.r0 * t.cols + b.c0;
    if (!t.two_pass || !b.second) {  // statistics, copying the block in on the way
      for (int64_t r = 0; r < b.rows; ++r) {
        const int64_t row = at + r * t.cols;
        auto [sq, gwx] = copy_stats(xs + r * b.cols, gs + r * b.cols, x + row, g + row, weight, b.cols);
        const bool set = !t.two_pass || b.first;
        local.r[r] = set ? sq : local.r[r] + sq;
        local.c[r] = set ? gwx : local.c[r] + gwx;
      }
      if (t.two_pass) continue;
    } else {
      copy_block_in(xs, x, t.cols, b);
      copy_block_in(gs, g, t.cols, b);
    }
    if (b.first) {  // r = rsqrt(mean(x^2) + eps), c = r^3 sum(g w x) / cols
      for (int64_t r = 0; r < b.rows; ++r) {
        const float rr = 1.0f / std::sqrt(local.r[r] / t.cols + a.eps);
        local.r[r] = rr;
        local.c[r] = rr * rr * rr * local.c[r] / t.cols;
      }
    }
    tile_grads(dx + at, t.cols, local.dw + b.c0, xs, gs, weight, local.r, local.c, b.rows, b.cols, a.stream);
  }
  if (a.stream) tiletune::stream_fence();
  std::memcpy(parts + core * t.cols, local.dw, t.cols * sizeof(float));  // copy-out of the partial sums
}

// dw = the cores' partial sums added in core order, columns split over the cores.
template <class T>
void sum_parts(const float* parts, T* dw, int64_t cols, int64_t block_dim) {
  tiletune::for_each_core(block_dim, [&](int64_t core) {
    auto [begin, end] = tiletune::core_range(cols, block_dim, core);
    for (int64_t i = begin; i < end; ++i) {
      float s = parts[i];
      for (int64_t k = 1; k < block_dim; ++k) s += parts[k * cols + i];
      dw[i] = static_cast<T>(s);
    }
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> native_rms_norm_backward(const at::Tensor& x, const at::Tensor& w,
                                                           const at::Tensor& grad, double eps,
                                                           int64_t tile_rows, int64_t tile_cols,
                                                           int64_t block_dim, int64_t buffer_num,
                                                           int64_t pipeline_depth) {
  Pipeline p{block_dim, buffer_num, pipeline_depth};
  tiletune::check_input(x, "x");
  tiletune::check_input(w, "w");
  tiletune::check_input(grad, "grad");
  TORCH_CHECK(x.dim() == 2, "x must be rows x cols");
  TORCH_CHECK(w.dim() == 1 && w.size(0) == x.size(1) && w.scalar_type() == x.scalar_type(),
              "w must be a vector of cols weights in x's dtype");
  TORCH_CHECK(grad.sizes() == x.sizes() && grad.scalar_type() == x.scalar_type(),
              "grad must have x's size and dtype");
  TORCH_CHECK(tile_rows >= 1 && tile_cols >= 1, "tile_rows and tile_cols must be >= 1");
  tiletune::check_pipeline(p);
  auto dx = at::empty_like(x);
  auto dw = at::empty_like(w);
  if (x.size(1) == 0) return {dx, dw};
  if (x.size(0) == 0) return {dx, dw.zero_()};
  GradArgs a{RowTiling(x.size(0), x.size(1), tile_rows, tile_cols), p, static_cast<float>(eps), false};
  auto parts = at::empty({block_dim, x.size(1)}, x.options().dtype(at::kFloat));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "native_rms_norm_backward", [&] {
    a.stream = static_cast<size_t>(x.numel()) * sizeof(scalar_t) > tiletune::streaming_bytes();
    const scalar_t* px = x.data_ptr<scalar_t>();
    const scalar_t* pw = w.data_ptr<scalar_t>();
    const scalar_t* pg = grad.data_ptr<scalar_t>();
    scalar_t* pdx = dx.data_ptr<scalar_t>();
    float* pp = parts.data_ptr<float>();
    tiletune::for_each_core(p.block_dim, [&](int64_t core) { grad_core(px, pw, pg, pdx, pp, a, core); });
    sum_parts(pp, dw.data_ptr<scalar_t>(), x.size(1), p.block_dim);
  });
  return {dx, dw};
}
