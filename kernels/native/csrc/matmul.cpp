// matmul: C[m, n] = A[m, k] @ B[k, n] with float32 accumulation, blocked over sgemm_.
//
// Output tiles tile_m x tile_n (row-major order, contiguous ranges per core); each takes one
// step per tile_k slice of k. A step copies the A and B blocks into their slots (packed, as
// float32; float32 blocks are read in place by sgemm_ through their leading dimensions, which
// packs them itself, so only their prefetch remains), then a single-threaded sgemm_ accumulates
// their product into the tile's float32 accumulator slot (beta 0 on the first step); copy-out
// converts the accumulator into C.
//
// Layouts: A and B are each row-major or transposed (the transpose of a row-major matrix,
// strides (1, rows): a Linear weight's .t()), both read in place. A transposed block is stored
// as rows of the other dim; it is prefetched and packed as stored (same slot size) and sgemm_
// takes it with its transpose flag.
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

// One operand of logical shape [rows, cols]: row-major (ld cols) or transposed (stored row-major
// [cols, rows], ld rows).
template <class T>
struct Operand {
  const T* base;
  int64_t ld;
  bool trans;
  // A block at logical (r0, c0) of rows x cols, as stored: its first element, how many stored
  // rows it spans and how long each is.
  struct Block {
    const T* p;
    int64_t stored_rows, length;
  };
  Block block(int64_t r0, int64_t c0, int64_t rows, int64_t cols) const {
    return trans ? Block{base + c0 * ld + r0, cols, rows} : Block{base + r0 * ld + c0, rows, cols};
  }
  void prefetch(const Block& b) const {
    for (int64_t r = 0; r < b.stored_rows; ++r) tiletune::prefetch(b.p + r * ld, b.length * sizeof(T));
  }
  // Copy-in: the block packed as stored (stored_rows x length), as float32; returns its ld.
  int64_t pack(const Block& b, float* slot) const {
    for (int64_t r = 0; r < b.stored_rows; ++r)
      tiletune::load_float(slot + r * b.length, b.p + r * ld, b.length);
    return b.length;
  }
};

template <class T>
void matmul_core(const Operand<T>& a, const Operand<T>& b, T* c, const MatmulTiling& g,
                 const Pipeline& p, int64_t core) {
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
    if (ahead > i && ahead < total) {
      const MatmulStep f = at(ahead);
      a.prefetch(a.block(f.i0, f.k0, f.mi, f.kk));
      b.prefetch(b.block(f.k0, f.j0, f.kk, f.nj));
    }
    const MatmulStep s = at(i);
    const int64_t slot = i % slots, out_slot = (i / ks) % slots;
    const auto ab = a.block(s.i0, s.k0, s.mi, s.kk);
    const auto bb = b.block(s.k0, s.j0, s.kk, s.nj);
    float* acc = acc_slots + out_slot * acc_tile;
    const float* pa;
    const float* pb;
    int64_t lda, ldb;
    if constexpr (std::is_same_v<T, float>) {  // sgemm_ reads float32 blocks in place
      pa = ab.p;
      pb = bb.p;
      lda = a.ld;
      ldb = b.ld;
    } else {  // copy-in: each block packed as stored, as float32
      float* la = a_slots + slot * a_tile;
      float* lb = b_slots + slot * b_tile;
      lda = a.pack(ab, la);
      ldb = b.pack(bb, lb);
      pa = la;
      pb = lb;
    }
    tiletune::gemm_rowmajor(static_cast<int>(s.mi), static_cast<int>(s.nj), static_cast<int>(s.kk),
                            pa, static_cast<int>(lda), a.trans, pb, static_cast<int>(ldb), b.trans,
                            s.first ? 0.0f : 1.0f, acc, static_cast<int>(s.nj));
    if (s.last) {  // copy-out
      for (int64_t r = 0; r < s.mi; ++r)
        tiletune::store_from_float(c + (s.i0 + r) * g.n + s.j0, acc + r * s.nj, s.nj);
    }
  }
}

// Whether matrix `t` (on the CPU) is read transposed: false for row-major (contiguous), true for
// the transpose of a row-major matrix (strides (1, rows); a non-contiguous one has both dims > 1);
// any other strides are refused.
bool transposed_layout(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, ": native kernels run on CPU tensors, got ", t.device());
  TORCH_CHECK(t.dim() == 2, name, " must be a matrix");
  if (t.is_contiguous()) return false;
  TORCH_CHECK(t.stride(0) == 1 && t.stride(1) == t.size(0), name,
              " must be row-major or the transpose of a row-major matrix (strides (1, rows))");
  return true;
}

}  // namespace

at::Tensor native_matmul(const at::Tensor& a, const at::Tensor& b, int64_t tile_m,
                            int64_t tile_n, int64_t tile_k, int64_t block_dim, int64_t buffer_num,
                            int64_t pipeline_depth) {
  const bool ta = transposed_layout(a, "a"), tb = transposed_layout(b, "b");
  TORCH_CHECK(a.size(1) == b.size(0), "a [m, k] and b [k, n] expected");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "a and b must have the same dtype");
  TORCH_CHECK(tile_m >= 1 && tile_n >= 1 && tile_k >= 1, "tiles must be >= 1");
  Pipeline p{block_dim, buffer_num, pipeline_depth};
  tiletune::check_pipeline(p);
  MatmulTiling g{a.size(0), b.size(1), a.size(1), tile_m, tile_n, tile_k};
  auto c = at::empty({g.m, g.n}, a.options());
  if (c.numel() == 0) return c;
  if (g.k == 0) return c.zero_();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "native_matmul", [&] {
    const Operand<scalar_t> oa{a.data_ptr<scalar_t>(), ta ? g.m : g.k, ta};
    const Operand<scalar_t> ob{b.data_ptr<scalar_t>(), tb ? g.k : g.n, tb};
    scalar_t* pc = c.data_ptr<scalar_t>();
    tiletune::for_each_core<true>(p.block_dim, [&](int64_t core) { matmul_core(oa, ob, pc, g, p, core); });
  });
  return c;
}
