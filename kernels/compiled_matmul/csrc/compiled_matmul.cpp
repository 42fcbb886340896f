// compiled_matmul: C[m, n] = A[m, k] @ B[k, n] in float32, its tiles fixed when it is built.
//
// Built once per config by tiletune's build cache (kernels/build_cache.py) with
// -DTILETUNE_TILE_M=.. -DTILETUNE_TILE_N=.. -DTILETUNE_TILE_K=..: the tile sizes are template
// parameters, so the compiler knows the inner loops' trip counts (unrolled, a row group's
// accumulators kept in vector registers where they fit). Built without those macros, the same code
// takes the tiles as run-time values (tiletune_matmul_runtime): what the compile-time tiles win is
// measured against it (benchmarks/compile_time_tiles.py). No torch headers: the library is loaded with
// ctypes and called on the tensors' data pointers (row-major, contiguous float32).
//
// Work: output tiles tile_m x tile_n in row-major order, contiguous ranges of them per thread
// (block_dim threads, OpenMP). A tile steps through k in tile_k slices: the B block is packed into
// a zero-padded panel of tile_k rows, each a whole number of vectors wide (so edge tiles
// run the same code and only their valid columns are stored), then the A rows are taken four at a
// time against it, accumulating into the tile's float32 accumulator (one per thread).
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace {

// One vector register of the machine the build is for (-march=native): 16 floats with AVX-512,
// else 8 (AVX2). A wider vector than the registers is split by the compiler into several, which at
// -O3 runs out of registers (spills): twice slower on an AVX2 machine.
#if defined(__AVX512F__)
typedef float vec __attribute__((vector_size(64)));
constexpr int64_t kLanes = 16;
#else
typedef float vec __attribute__((vector_size(32)));
constexpr int64_t kLanes = 8;
#endif
constexpr int64_t kRows = 4;  // rows of A per micro step

template <int64_t TM, int64_t TN, int64_t TK>
struct StaticTiles {
  static constexpr int64_t tm() { return TM; }
  static constexpr int64_t tn() { return TN; }
  static constexpr int64_t tk() { return TK; }
  static constexpr int64_t vectors() { return (TN + kLanes - 1) / kLanes; }
};

struct RuntimeTiles {
  int64_t m, n, k;
  int64_t tm() const { return m; }
  int64_t tn() const { return n; }
  int64_t tk() const { return k; }
  int64_t vectors() const { return (n + kLanes - 1) / kLanes; }
};

struct Problem {
  const float* a;
  const float* b;
  float* c;
  int64_t m, n, k;
};

// R rows of the accumulator (each `vectors` wide) += R rows of A [.., kk] x the panel [kk, vectors].
template <int64_t R, class Tiles>
inline void micro(const Tiles& t, const float* __restrict a, int64_t lda, const vec* __restrict panel,
                  int64_t kk, vec* __restrict acc) {
  const int64_t nv = t.vectors();
  for (int64_t p = 0; p < kk; ++p) {
    const vec* __restrict row = panel + p * nv;
    for (int64_t r = 0; r < R; ++r) {
      const float av = a[r * lda + p];
      vec* __restrict out = acc + r * nv;
      for (int64_t v = 0; v < nv; ++v) out[v] += av * row[v];
    }
  }
}

// The panel: B [k0 : k0 + kk, j0 : j0 + nj] as kk rows of `vectors` vectors, zero beyond nj.
template <class Tiles>
void pack(const Tiles& t, const Problem& pr, int64_t k0, int64_t kk, int64_t j0, int64_t nj, vec* panel) {
  const int64_t width = t.vectors() * kLanes;
  float* out = reinterpret_cast<float*>(panel);
  for (int64_t p = 0; p < kk; ++p) {
    std::memcpy(out + p * width, pr.b + (k0 + p) * pr.n + j0, nj * sizeof(float));
    std::memset(out + p * width + nj, 0, (width - nj) * sizeof(float));
  }
}

template <class Tiles>
void tile(const Tiles& t, const Problem& pr, int64_t i0, int64_t j0, vec* panel, vec* acc) {
  const int64_t mi = std::min(t.tm(), pr.m - i0), nj = std::min(t.tn(), pr.n - j0), nv = t.vectors();
  std::memset(static_cast<void*>(acc), 0, mi * nv * sizeof(vec));
  for (int64_t k0 = 0; k0 < pr.k; k0 += t.tk()) {
    const int64_t kk = std::min(t.tk(), pr.k - k0);
    pack(t, pr, k0, kk, j0, nj, panel);
    const float* rows = pr.a + i0 * pr.k + k0;
    int64_t r = 0;
    if (kk == t.tk()) {  // a whole slice: its length is the tile's (a constant when built with it)
      for (; r + kRows <= mi; r += kRows) micro<kRows>(t, rows + r * pr.k, pr.k, panel, t.tk(), acc + r * nv);
    } else {
      for (; r + kRows <= mi; r += kRows) micro<kRows>(t, rows + r * pr.k, pr.k, panel, kk, acc + r * nv);
    }
    for (; r < mi; ++r) micro<1>(t, rows + r * pr.k, pr.k, panel, kk, acc + r * nv);
  }
  for (int64_t r = 0; r < mi; ++r)
    std::memcpy(pr.c + (i0 + r) * pr.n + j0, reinterpret_cast<const float*>(acc + r * nv), nj * sizeof(float));
}

// Every output tile, contiguous ranges of them over block_dim threads. 0: done; 1: out of memory.
template <class Tiles>
int matmul(const Tiles& t, const Problem& pr, int64_t block_dim) {
  if (pr.m == 0 || pr.n == 0) return 0;
  if (pr.k == 0) {
    std::memset(pr.c, 0, pr.m * pr.n * sizeof(float));
    return 0;
  }
  const int64_t tiles_n = (pr.n + t.tn() - 1) / t.tn(), tiles = (pr.m + t.tm() - 1) / t.tm() * tiles_n;
  const int64_t threads = std::max<int64_t>(1, std::min(block_dim, tiles));
  const size_t panel_bytes = t.tk() * t.vectors() * sizeof(vec), acc_bytes = t.tm() * t.vectors() * sizeof(vec);
  int failed = 0;
#pragma omp parallel num_threads(static_cast<int>(threads)) if (threads > 1) reduction(| : failed)
  {
    const int64_t id = omp_get_thread_num(), count = omp_get_num_threads();
    const int64_t first = tiles * id / count, last = tiles * (id + 1) / count;
    vec* panel = static_cast<vec*>(std::aligned_alloc(sizeof(vec), panel_bytes));
    vec* acc = static_cast<vec*>(std::aligned_alloc(sizeof(vec), acc_bytes));
    if (panel == nullptr || acc == nullptr) {
      failed = 1;
    } else {
      for (int64_t x = first; x < last; ++x) tile(t, pr, x / tiles_n * t.tm(), x % tiles_n * t.tn(), panel, acc);
    }
    std::free(panel);
    std::free(acc);
  }
  return failed;
}

}  // namespace

#if defined(TILETUNE_TILE_M) && defined(TILETUNE_TILE_N) && defined(TILETUNE_TILE_K)
static_assert(TILETUNE_TILE_M >= 1 && TILETUNE_TILE_N >= 1 && TILETUNE_TILE_K >= 1, "tiles must be >= 1");

// The kernel with the tiles it was built with. 0: done; 1: out of memory; 2: a bad argument.
extern "C" int tiletune_matmul(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k,
                               int64_t block_dim) {
  if (block_dim < 1 || m < 0 || n < 0 || k < 0) return 2;
  return matmul(StaticTiles<TILETUNE_TILE_M, TILETUNE_TILE_N, TILETUNE_TILE_K>{}, Problem{a, b, c, m, n, k},
                block_dim);
}

// The tiles it was built with: tile_m, tile_n, tile_k.
extern "C" void tiletune_matmul_tiles(int64_t* out) {
  out[0] = TILETUNE_TILE_M;
  out[1] = TILETUNE_TILE_N;
  out[2] = TILETUNE_TILE_K;
}
#else
// Built without tiles: the kernel with its tiles given at run time (a config's build compiles only
// its own instantiation, which halves its compile). 0: done; 1: out of memory; 2: a bad argument.
extern "C" int tiletune_matmul_runtime(const float* a, const float* b, float* c, int64_t m, int64_t n,
                                       int64_t k, int64_t tile_m, int64_t tile_n, int64_t tile_k,
                                       int64_t block_dim) {
  if (tile_m < 1 || tile_n < 1 || tile_k < 1 || block_dim < 1 || m < 0 || n < 0 || k < 0) return 2;
  return matmul(RuntimeTiles{tile_m, tile_n, tile_k}, Problem{a, b, c, m, n, k}, block_dim);
}
#endif
