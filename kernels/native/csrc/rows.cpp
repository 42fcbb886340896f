// softmax and rms_norm over a rows x cols matrix: tile_rows x tile_cols tiles.
//
// A row tile whose tiles span the whole row (tile_cols >= cols) is one step. Otherwise it takes
// two passes over its column tiles, copying each in again: pass one accumulates per-row float32
// statistics (softmax: the running max and rescaled sum, i.e. the online softmax; rms_norm: the
// sum of squares), pass two produces each column tile. Row tiles are split over the cores in
// contiguous ranges. Copy-out is fused with compute: an output-producing step writes its block
// of y directly from the input slot (and a float32 row of scratch), streaming stores when y is
// larger than the caches; there is no output slot.
#include "native.h"

namespace {

using tiletune::Pipeline;
using tiletune::RowTiling;
using Block = tiletune::RowBlock;

template <class T>
void copy_block_in(T* slot, const T* x, int64_t ld, const Block& b) {
  for (int64_t r = 0; r < b.rows; ++r)
    std::memcpy(slot + r * b.cols, x + (b.r0 + r) * ld + b.c0, b.cols * sizeof(T));
}

template <class T>
void prefetch_block(const T* x, int64_t ld, const Block& b) {
  for (int64_t r = 0; r < b.rows; ++r) tiletune::prefetch(x + (b.r0 + r) * ld + b.c0, b.cols * sizeof(T));
}

// e[i] = exp(v[i] - shift) (e: float32 scratch of n; null: the sum only); returns the sum of e.
template <class T>
float exp_shifted(const T* v, float shift, float* e, int64_t n, float* scratch) {
  if constexpr (std::is_same_v<T, float>) {
    return tiletune::exp_shift_sum(v, shift, e, n);
  } else {
    tiletune::load_float(scratch, v, n);
    return tiletune::exp_shift_sum(scratch, shift, e ? e : scratch, n);
  }
}

template <class T>
float sum_squares(const T* v, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) {
    float f = tiletune::to_float(v[i]);
    s += f * f;
  }
  return s;
}

// Local memory of one core: buffer_num input slots, float32 statistics and a row of scratch,
// and (rms_norm) the weight: once per call for whole rows, buffer_num column slots otherwise.
template <class T>
struct RowLocal {
  T* in;
  T* weight;
  float* stat_a;
  float* stat_b;
  float* scratch;
  int64_t tile;

  RowLocal(const RowTiling& g, int64_t slots, int64_t weight_elems) {
    tile = g.tile_rows * g.tile_cols;
    auto round = [](size_t bytes) { return (bytes + 63) / 64 * 64; };
    size_t queues = round(slots * tile * sizeof(T)), w = round(weight_elems * sizeof(T));
    size_t stats = round(2 * g.tile_rows * sizeof(float)), scratch_bytes = round(g.tile_cols * sizeof(float));
    char* base = static_cast<char*>(tiletune::local_memory(queues + w + stats + scratch_bytes));
    in = reinterpret_cast<T*>(base);
    weight = reinterpret_cast<T*>(base + queues);
    stat_a = reinterpret_cast<float*>(base + queues + w);
    stat_b = stat_a + g.tile_rows;
    scratch = reinterpret_cast<float*>(base + queues + w + stats);
  }
};

// Calls step(block, slot) for every step of this core's row tiles, issuing copy-ins ahead.
template <class T, class Step>
void row_steps(const RowTiling& g, const T* x, const Pipeline& p, int64_t core, const Step& step) {
  auto [first, last] = tiletune::core_range(g.row_tiles(), p.block_dim, core);
  const int64_t spt = g.steps_per_tile(), total = (last - first) * spt;
  auto block_of = [&](int64_t i) { return g.block(first + i / spt, i % spt); };
  for (int64_t i = 0; i < total; ++i) {
    const int64_t ahead = i + p.pipeline_depth - 1;
    if (ahead > i && ahead < total) prefetch_block(x, g.cols, block_of(ahead));
    step(block_of(i), i % p.buffer_num);
  }
}

template <class T>
void softmax_core(const T* x, T* y, const RowTiling& g, const Pipeline& p, int64_t core) {
  RowLocal<T> local(g, p.buffer_num, 0);
  const bool stream = static_cast<size_t>(g.rows * g.cols) * sizeof(T) > tiletune::streaming_bytes();
  row_steps(g, x, p, core, [&](const Block& b, int64_t slot) {
    T* in = local.in + slot * local.tile;
    const bool stats = !g.two_pass || !b.second;
    if (!stats) copy_block_in(in, x, g.cols, b);
    for (int64_t r = 0; r < b.rows; ++r) {
      const T* v = in + r * b.cols;
      float& m = local.stat_a[r];
      float& l = local.stat_b[r];
      if (stats) {  // statistics: the whole row, or fold in a column tile
        // copy-in of the row, its max on the way
        const float bm = tiletune::copy_max(in + r * b.cols, x + (b.r0 + r) * g.cols + b.c0, b.cols);
        if (!g.two_pass || b.first) {
          m = bm;
          l = g.two_pass ? exp_shifted(v, m, nullptr, b.cols, local.scratch) : 0.0f;
        } else {
          const float nm = std::max(m, bm);
          l = l * tiletune::exp_approx(m - nm) + exp_shifted(v, nm, nullptr, b.cols, local.scratch);
          m = nm;
        }
        if (g.two_pass) continue;
      }
      T* o = y + (b.r0 + r) * g.cols + b.c0;
      float* e = local.scratch;
      const float sum = exp_shifted(v, m, e, b.cols, e);
      if (!g.two_pass) l = sum;
      const float inv = 1.0f / l;
      tiletune::store_each(o, b.cols, stream, [&](int64_t i) { return e[i] * inv; });  // copy-out
    }
  });
  if (stream) tiletune::stream_fence();
}

template <class T>
void rms_norm_core(const T* x, const T* w, T* y, float eps, const RowTiling& g, const Pipeline& p,
                   int64_t core) {
  const int64_t weight_elems = g.two_pass ? p.buffer_num * g.tile_cols : g.cols;
  RowLocal<T> local(g, p.buffer_num, weight_elems);
  if (!g.two_pass) std::memcpy(local.weight, w, g.cols * sizeof(T));  // once per call
  const bool stream = static_cast<size_t>(g.rows * g.cols) * sizeof(T) > tiletune::streaming_bytes();
  row_steps(g, x, p, core, [&](const Block& b, int64_t slot) {
    T* in = local.in + slot * local.tile;
    copy_block_in(in, x, g.cols, b);
    const T* weight = local.weight;
    if (g.two_pass && b.second) {
      T* ws = local.weight + slot * g.tile_cols;
      std::memcpy(ws, w + b.c0, b.cols * sizeof(T));
      weight = ws;
    }
    for (int64_t r = 0; r < b.rows; ++r) {
      const T* v = in + r * b.cols;
      float& s = local.stat_a[r];
      if (!g.two_pass || !b.second) {
        const float block = sum_squares(v, b.cols);
        s = (!g.two_pass || b.first) ? block : s + block;
        if (g.two_pass) continue;
      }
      if (!g.two_pass || b.first) local.stat_b[r] = 1.0f / std::sqrt(s / g.cols + eps);
      const float scale = local.stat_b[r];
      T* o = y + (b.r0 + r) * g.cols + b.c0;
      tiletune::store_each(o, b.cols, stream, [&](int64_t i) {  // compute fused with copy-out
        return tiletune::to_float(v[i]) * scale * tiletune::to_float(weight[i]);
      });
    }
  });
  if (stream) tiletune::stream_fence();
}

RowTiling checked_tiling(const at::Tensor& x, int64_t tile_rows, int64_t tile_cols,
                         const Pipeline& p) {
  tiletune::check_input(x, "x");
  TORCH_CHECK(x.dim() == 2, "x must be rows x cols");
  TORCH_CHECK(tile_rows >= 1 && tile_cols >= 1, "tile_rows and tile_cols must be >= 1");
  tiletune::check_pipeline(p);
  return RowTiling(x.size(0), x.size(1), tile_rows, tile_cols);
}

}  // namespace

at::Tensor native_softmax(const at::Tensor& x, int64_t tile_rows, int64_t tile_cols,
                             int64_t block_dim, int64_t buffer_num, int64_t pipeline_depth) {
  Pipeline p{block_dim, buffer_num, pipeline_depth};
  RowTiling g = checked_tiling(x, tile_rows, tile_cols, p);
  auto y = at::empty_like(x);
  if (x.numel() == 0) return y;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "native_softmax", [&] {
    const scalar_t* px = x.data_ptr<scalar_t>();
    scalar_t* py = y.data_ptr<scalar_t>();
    tiletune::for_each_core(p.block_dim, [&](int64_t core) { softmax_core(px, py, g, p, core); });
  });
  return y;
}

at::Tensor native_rms_norm(const at::Tensor& x, const at::Tensor& w, double eps,
                              int64_t tile_rows, int64_t tile_cols, int64_t block_dim,
                              int64_t buffer_num, int64_t pipeline_depth) {
  Pipeline p{block_dim, buffer_num, pipeline_depth};
  RowTiling g = checked_tiling(x, tile_rows, tile_cols, p);
  tiletune::check_input(w, "w");
  TORCH_CHECK(w.dim() == 1 && w.size(0) == x.size(1) && w.scalar_type() == x.scalar_type(),
              "w must be a vector of cols weights in x's dtype");
  auto y = at::empty_like(x);
  if (x.numel() == 0) return y;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "native_rms_norm", [&] {
    const scalar_t* px = x.data_ptr<scalar_t>();
    const scalar_t* pw = w.data_ptr<scalar_t>();
    scalar_t* py = y.data_ptr<scalar_t>();
    tiletune::for_each_core(p.block_dim, [&](int64_t core) {
      rms_norm_core(px, pw, py, static_cast<float>(eps), g, p, core);
    });
  });
  return y;
}
