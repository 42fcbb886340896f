// matmul: C[m, n] = A[m, k] @ B[k, n] with float32 accumulation, blocked over sgemm_.
//
// Output tiles tile_m x tile_n (row-major order, contiguous ranges per core); each takes one
// step per tile_k slice of k. A step copies the A and B blocks into their slots (packed, as
// float32; float32 blocks are read in place by sgemm_ through their leading dimensions, which
// packs them itself, so only their prefetch remains), then a single-threaded sgemm_ accumulates
// their product into the tile's float32 accumulator slot (beta 0 on the first step); copy-out
// converts the accumulator into C.
#include "native.h"

namespace {

using tiletune::Pipeline;

struct MatmulTiling {
  int64_t m, n, k, tm, tn, tk;
  int64_t tiles_n() const { return (n + tn - 1) / tn; }
  int64_t tiles() const { return (m + tm - 1) / tm * tiles_n(); }
  int64_t k_steps() const { return (k + tk - 1) / tk; }
};

struct MatmulStep {
  int64_t i0, mi, j0, nj, k0, kk;
  bool first, last;
};

MatmulStep step_of(const MatmulTiling& g, int64_t tile, int64_t ks) {
  const int64_t i0 = tile / g.tiles_n() * g.tm, j0 = tile % g.tiles_n() * g.tn, k0 = ks * g.tk;
  return {i0, std::min(g.tm, g.m - i0), j0, std::min(g.tn, g.n - j0), k0, std::min(g.tk, g.k - k0),
          ks == 0, ks == g.k_steps() - 1};
}

template <class T>
void prefetch_step(const T* a, const T* b, const MatmulTiling& g, const MatmulStep& s) {
  for (int64_t r = 0; r < s.mi; ++r) tiletune::prefetch(a + (s.i0 + r) * g.k + s.k0, s.kk * sizeof(T));
  for (int64_t r = 0; r < s.kk; ++r) tiletune::prefetch(b + (s.k0 + r) * g.n + s.j0, s.nj * sizeof(T));
}

template <class T>
void matmul_core(const T* a, const T* b, T* c, const MatmulTiling& g, const Pipeline& p,
                 int64_t core) {
  auto [first, last] = tiletune::core_range(g.tiles(), p.block_dim, core);
  if (first >= last) return;
  const int64_t slots = p.buffer_num, a_tile = g.tm * g.tk, b_tile = g.tk * g.tn, acc_tile = g.tm * g.tn;
  float* local = static_cast<float*>(
      tiletune::local_memory(slots * (a_tile + b_tile + acc_tile) * sizeof(float)));
  float* a_slots = local;
  float* b_slots = a_slots + slots * a_tile;
  float* acc_slots = b_slots + slots * b_tile;
  const int64_t ks = g.k_steps(), total = (last - first) * ks;
  auto at = [&](int64_t i) { return step_of(g, first + i / ks, i % ks); };
  for (int64_t i = 0; i < total; ++i) {
    const int64_t ahead = i + p.pipeline_depth - 1;
    if (ahead > i && ahead < total) prefetch_step(a, b, g, at(ahead));
    const MatmulStep s = at(i);
    const int64_t slot = i % slots, out_slot = (i / ks) % slots;
    float* la = a_slots + slot * a_tile;
    float* lb = b_slots + slot * b_tile;
    float* acc = acc_slots + out_slot * acc_tile;
    const float* ab = la;
    const float* bb = lb;
    int lda = static_cast<int>(s.kk), ldb = static_cast<int>(s.nj);
    if constexpr (std::is_same_v<T, float>) {  // sgemm_ reads float32 blocks in place (ld k, n)
      ab = a + s.i0 * g.k + s.k0;
      bb = b + s.k0 * g.n + s.j0;
      lda = static_cast<int>(g.k);
      ldb = static_cast<int>(g.n);
    } else {
      for (int64_t r = 0; r < s.mi; ++r)  // copy-in: A block, packed mi x kk, as float32
        tiletune::load_float(la + r * s.kk, a + (s.i0 + r) * g.k + s.k0, s.kk);
      for (int64_t r = 0; r < s.kk; ++r)  // B block, packed kk x nj
        tiletune::load_float(lb + r * s.nj, b + (s.k0 + r) * g.n + s.j0, s.nj);
    }
    tiletune::gemm_rowmajor(static_cast<int>(s.mi), static_cast<int>(s.nj), static_cast<int>(s.kk),
                            ab, lda, bb, ldb, false, s.first ? 0.0f : 1.0f, acc,
                            static_cast<int>(s.nj));
    if (s.last) {  // copy-out
      for (int64_t r = 0; r < s.mi; ++r)
        tiletune::store_from_float(c + (s.i0 + r) * g.n + s.j0, acc + r * s.nj, s.nj);
    }
  }
}

}  // namespace

at::Tensor native_matmul(const at::Tensor& a, const at::Tensor& b, int64_t tile_m,
                            int64_t tile_n, int64_t tile_k, int64_t block_dim, int64_t buffer_num,
                            int64_t pipeline_depth) {
  tiletune::check_input(a, "a");
  tiletune::check_input(b, "b");
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "a [m, k] and b [k, n] expected");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "a and b must have the same dtype");
  TORCH_CHECK(tile_m >= 1 && tile_n >= 1 && tile_k >= 1, "tiles must be >= 1");
  Pipeline p{block_dim, buffer_num, pipeline_depth};
  tiletune::check_pipeline(p);
  MatmulTiling g{a.size(0), b.size(1), a.size(1), tile_m, tile_n, tile_k};
  auto c = at::empty({g.m, g.n}, a.options());
  if (c.numel() == 0) return c;
  if (g.k == 0) return c.zero_();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "native_matmul", [&] {
    const scalar_t* pa = a.data_ptr<scalar_t>();
    const scalar_t* pb = b.data_ptr<scalar_t>();
    scalar_t* pc = c.data_ptr<scalar_t>();
    tiletune::for_each_core<true>(p.block_dim, [&](int64_t core) { matmul_core(pa, pb, pc, g, p, core); });
  });
  return c;
}
