// Attention backward, FlashAttention-2 style: dq, dk and dv of O = softmax(scale * Q K^T + mask) V
// for the gradient of O alone (a gradient of the log-sum-exp is folded into D).
//
// Shapes as the forward's (attention.cpp): q, out, grad_out [batch, heads, seq_q, d], k and v
// [batch, kv_heads, seq_kv, d] (query head h reads kv head h / (heads / kv_heads)), lse [batch,
// heads, seq_q] float32 natural log (-inf: the row sees no key, P = 0). The probabilities are
// recomputed from lse, never stored: P = exp(scale * Q K^T + mask - lse) on each row's visible
// keys (causal: j <= i + diagonal), 0 elsewhere; dP = dO V^T, dS = P * (dP - D) with
// D = rowsum(dO * O) - grad_lse, computed once per row first.
//
// The kv pass: a tile is one block_kv block of keys of one (batch, kv head) "unit"; its steps are
// the (query head of the group, block_q block of queries) pairs that see the block (causal: from
// the first q block with a query that sees its first key), accumulating dV += P^T dO and
// dK += dS^T Q in float32; copy-out writes scale * dK and dV. Two ways to get dq:
// - fused (one pass, five block products per pair): each core owns whole units (dealt
//   round-robin), so it alone writes their dq rows: every step also adds dS K into the unit's
//   float32 dq accumulator (the output itself for float32), scaled on the unit's last tile;
// - two passes (when the units are too few to keep block_dim cores balanced): the kv pass's
//   tiles (unit, kv block) are dealt round-robin, then the q pass: a tile is one block_q block of
//   queries of one (batch, head), its steps the kv blocks it sees (the forward's bounds),
//   recomputing P and dS and accumulating dQ += dS K.
// The fused pass runs when ceil(units / block_dim) * block_dim * 5 <= units * 7 (its five products
// per pair on the busiest core against the two passes' seven, evenly spread).
//
// Execution (native.h's model): a step's streamed blocks (the kv pass: Q and dO; the q pass: K and
// V) are converted into float32 slots rotating over buffer_num (float32 blocks are read in place),
// the tile's own blocks once per tile; the accumulators rotate over buffer_num slots per tile;
// before each step, the blocks (and mask rows) of the step pipeline_depth - 1 ahead are
// prefetched. Block products are single-threaded sgemm_.
#include <array>
#include <vector>

#include "native.h"

namespace {

using tiletune::MaskView;
using tiletune::Pipeline;
using tiletune::mask_strides;

struct BackwardTiling {
  int64_t batch, heads, kv_heads, seq_q, seq_kv, d, bq, bkv;
  int64_t causal;  // 0 none, 1 top-left aligned, 2 bottom-right aligned
  float scale;
  int64_t q_blocks() const { return (seq_q + bq - 1) / bq; }
  int64_t kv_blocks() const { return (seq_kv + bkv - 1) / bkv; }
  int64_t group() const { return heads / kv_heads; }
  int64_t units() const { return batch * kv_heads; }
  // Query i sees keys j <= i + diagonal() (causal).
  int64_t diagonal() const { return causal == 2 ? seq_kv - seq_q : 0; }
  // The keys q block qb sees: [0, kv_end(qb)).
  int64_t kv_end(int64_t qb) const {
    if (causal == 0) return seq_kv;
    const int64_t end = std::min(seq_q, (qb + 1) * bq) + diagonal();
    return std::max<int64_t>(0, std::min(seq_kv, end));
  }
  // The first q block with a query that sees key kv0 (q_blocks(): none).
  int64_t first_q_block(int64_t kv0) const {
    if (causal == 0) return 0;
    const int64_t first = std::max<int64_t>(0, kv0 - diagonal());
    return first >= seq_q ? q_blocks() : first / bq;
  }
  // Elements of one streamed or tile block slot: the larger of a Q and a K block.
  int64_t block() const { return std::max(bq, bkv) * d; }
  int64_t accumulator() const { return std::max(2 * bkv * d, bq * d); }
};

// The fused pass when its busiest core's five products per pair beat seven spread evenly.
bool use_fused(int64_t units, int64_t block_dim) {
  const int64_t busiest = (units + block_dim - 1) / block_dim;
  return busiest * block_dim * 5 <= units * 7;
}

template <class T>
struct BackwardInputs {
  const T *q, *k, *v, *grad_out;
  const float *lse, *delta;
  MaskView<T> mask;
};

// A core's local memory: buffer_num float32 slots of each streamed block, one of each tile block,
// P and dS of one block pair and buffer_num accumulators (dk and dv, or dq).
struct BackwardLocal {
  float *stream, *tile, *p, *ds, *acc;
  int64_t block, accumulator;
  float* streamed(int64_t slot, int64_t which) const { return stream + (2 * slot + which) * block; }
  float* tiled(int64_t which) const { return tile + which * block; }
  float* accumulators(int64_t slot) const { return acc + slot * accumulator; }
};

BackwardLocal allocate(const BackwardTiling& g, int64_t slots) {
  BackwardLocal l{};
  l.block = g.block();
  l.accumulator = g.accumulator();
  const int64_t st = g.bq * g.bkv;
  const int64_t floats = 2 * slots * l.block + 2 * l.block + 2 * st + slots * l.accumulator;
  l.stream = static_cast<float*>(tiletune::local_memory(floats * sizeof(float)));
  l.tile = l.stream + 2 * slots * l.block;
  l.p = l.tile + 2 * l.block;
  l.ds = l.p + st;
  l.acc = l.ds + st;
  return l;
}

// `count` elements at src as float32: src itself for float32, else converted into `slot`.
template <class T>
const float* as_float(const T* src, float* slot, int64_t count) {
  if constexpr (std::is_same_v<T, float>) {
    (void)slot;
    (void)count;
    return src;
  } else {
    tiletune::load_float(slot, src, count);
    return slot;
  }
}

// Row-major C[m, n] = alpha * op(A) op(B) + beta * C (native.h's gemm_rowmajor with an alpha).
void gemm(int m, int n, int k, float alpha, const float* a, int lda, bool trans_a, const float* b, int ldb,
          bool trans_b, float beta, float* c, int ldc) {
  const char tb = trans_b ? 'T' : 'N', ta = trans_a ? 'T' : 'N';
  sgemm_(&tb, &ta, &n, &m, &k, &alpha, b, &ldb, a, &lda, &beta, c, &ldc);
}

// One (q block, kv block) pair: rows queries from q0 of flat (batch, head) bh, cols keys from kv0.
struct BlockPair {
  const float *q, *grad_out, *k, *v;
  int64_t bh, q0, rows, kv0, cols;
};

// l.p <- P and l.ds <- dS = P * (dO V^T - D) of the pair (both [rows, cols]): P is
// exp(scale * Q K^T + mask - lse) on each row's visible keys, 0 on the others and on the rows
// whose lse is -inf.
template <class T>
void recompute(const BackwardLocal& l, const BackwardInputs<T>& in, const BackwardTiling& g, const BlockPair& b) {
  const int ir = static_cast<int>(b.rows), ic = static_cast<int>(b.cols), id = static_cast<int>(g.d);
  gemm(ir, ic, id, g.scale, b.q, id, false, b.k, id, true, 0.0f, l.p, ic);
  gemm(ir, ic, id, 1.0f, b.grad_out, id, false, b.v, id, true, 0.0f, l.ds, ic);
  const float* lse = in.lse + b.bh * g.seq_q + b.q0;
  const float* delta = in.delta + b.bh * g.seq_q + b.q0;
  const int64_t diagonal = g.diagonal();
  for (int64_t r = 0; r < b.rows; ++r) {
    float* s = l.p + r * b.cols;
    float* ds = l.ds + r * b.cols;
    int64_t n = g.causal != 0 ? std::min(b.cols, b.q0 + r + diagonal - b.kv0 + 1) : b.cols;
    if (lse[r] == -INFINITY) n = 0;
    n = std::max<int64_t>(0, n);
    if (in.mask.data != nullptr && n > 0) {
      const T* m = in.mask.row(g.heads, b.bh, b.q0 + r) + b.kv0 * in.mask.key;
      for (int64_t j = 0; j < n; ++j) s[j] += tiletune::to_float(m[j * in.mask.key]);
    }
    if (n > 0) tiletune::exp_shift_sum(s, lse[r], s, n);
    const float dr = delta[r];
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) ds[j] = s[j] * (ds[j] - dr);
    std::fill(s + n, s + b.cols, 0.0f);
    std::fill(ds + n, ds + b.cols, 0.0f);
  }
}

// dst[i] = T(src[i] * factor) for i in [0, count).
template <class T>
void store_scaled(T* dst, const float* src, int64_t count, float factor) {
#pragma omp simd
  for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<T>(src[i] * factor);
}

// Prefetch `rows` rows of the mask from query q0 of flat (batch, head) bh, keys [kv0, kv0 + cols).
template <class T>
void prefetch_mask(const MaskView<T>& mask, const BackwardTiling& g, int64_t bh, int64_t q0, int64_t rows,
                   int64_t kv0, int64_t cols) {
  if (mask.data == nullptr || mask.key != 1) return;
  for (int64_t r = 0; r < rows; ++r) tiletune::prefetch(mask.row(g.heads, bh, q0 + r) + kv0, cols * sizeof(T));
}

// One step of a core's plan: tile `tile` of the core's list, `inner` (the kv pass: a query head of
// the group; the q pass: unused) and `block` (the kv pass: a q block; the q pass: a kv block; -1: a
// tile with nothing to visit, whose output is zeros); first/last of its tile.
struct Step {
  int64_t tile, inner, block;
  bool first, last;
};

// The kv pass's tiles on one core, as (unit, kv block): whole units (fused) or dealt round-robin.
std::vector<std::pair<int64_t, int64_t>> kv_tiles(const BackwardTiling& g, int64_t block_dim, int64_t core,
                                                  bool fused) {
  std::vector<std::pair<int64_t, int64_t>> tiles;
  const int64_t kvbs = g.kv_blocks();
  if (fused) {
    for (int64_t u = core; u < g.units(); u += block_dim)
      for (int64_t kb = 0; kb < kvbs; ++kb) tiles.emplace_back(u, kb);
  } else {
    for (int64_t t = core; t < g.units() * kvbs; t += block_dim) tiles.emplace_back(t / kvbs, t % kvbs);
  }
  return tiles;
}

std::vector<Step> kv_steps(const BackwardTiling& g, const std::vector<std::pair<int64_t, int64_t>>& tiles) {
  std::vector<Step> steps;
  for (size_t t = 0; t < tiles.size(); ++t) {
    const int64_t first = g.first_q_block(tiles[t].second * g.bkv);
    const size_t begin = steps.size();
    for (int64_t h = 0; h < g.group(); ++h)
      for (int64_t qb = first; qb < g.q_blocks(); ++qb) steps.push_back({static_cast<int64_t>(t), h, qb, false, false});
    if (steps.size() == begin) steps.push_back({static_cast<int64_t>(t), 0, -1, false, false});
    steps[begin].first = true;
    steps.back().last = true;
  }
  return steps;
}

// The kv pass on one core: dk and dv of its tiles and, fused (dq_work: the float32 dq accumulator of
// every row, the output itself for float32), the dq of its units.
template <class T>
void kv_core(const BackwardInputs<T>& in, T* dk, T* dv, T* dq, float* dq_work, const BackwardTiling& g,
             const Pipeline& p, int64_t core) {
  const bool fused = dq_work != nullptr;
  const auto tiles = kv_tiles(g, p.block_dim, core, fused);
  if (tiles.empty()) return;
  const auto steps = kv_steps(g, tiles);
  const int64_t d = g.d, slots = p.buffer_num, unit_rows = g.group() * g.seq_q;
  const BackwardLocal l = allocate(g, slots);
  const int id = static_cast<int>(d);
  float *dk_acc = nullptr, *dv_acc = nullptr, *dq_acc = nullptr;
  const float *kb = nullptr, *vb = nullptr;
  int64_t tile_index = -1;
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    const auto [unit, kvb] = tiles[s.tile];
    const int64_t kv0 = kvb * g.bkv, cols = std::min(g.bkv, g.seq_kv - kv0), kv_offset = (unit * g.seq_kv + kv0) * d;
    const int64_t first_bh = (unit / g.kv_heads) * g.heads + (unit % g.kv_heads) * g.group();
    const size_t ahead = i + p.pipeline_depth - 1;
    if (ahead > i && ahead < steps.size() && steps[ahead].block >= 0) {
      const Step& a = steps[ahead];
      const auto [a_unit, a_kvb] = tiles[a.tile];
      const int64_t a_bh = (a_unit / g.kv_heads) * g.heads + (a_unit % g.kv_heads) * g.group() + a.inner;
      const int64_t a_q0 = a.block * g.bq, a_rows = std::min(g.bq, g.seq_q - a_q0);
      tiletune::prefetch(in.q + (a_bh * g.seq_q + a_q0) * d, a_rows * d * sizeof(T));
      tiletune::prefetch(in.grad_out + (a_bh * g.seq_q + a_q0) * d, a_rows * d * sizeof(T));
      prefetch_mask(in.mask, g, a_bh, a_q0, a_rows, a_kvb * g.bkv, std::min(g.bkv, g.seq_kv - a_kvb * g.bkv));
    }
    if (s.first) {
      ++tile_index;
      dk_acc = l.accumulators(tile_index % slots);
      dv_acc = dk_acc + g.bkv * d;
      std::fill(dk_acc, dk_acc + 2 * g.bkv * d, 0.0f);
      kb = as_float(in.k + kv_offset, l.tiled(0), cols * d);
      vb = as_float(in.v + kv_offset, l.tiled(1), cols * d);
      if (fused) {
        dq_acc = dq_work + first_bh * g.seq_q * d;
        if (kvb == 0) std::fill(dq_acc, dq_acc + unit_rows * d, 0.0f);
      }
    }
    if (s.block >= 0) {
      const int64_t bh = first_bh + s.inner, q0 = s.block * g.bq, rows = std::min(g.bq, g.seq_q - q0);
      const int64_t q_offset = (bh * g.seq_q + q0) * d, slot = static_cast<int64_t>(i) % slots;
      const BlockPair b{as_float(in.q + q_offset, l.streamed(slot, 0), rows * d),
                        as_float(in.grad_out + q_offset, l.streamed(slot, 1), rows * d), kb, vb, bh, q0, rows, kv0, cols};
      recompute(l, in, g, b);
      const int ir = static_cast<int>(rows), ic = static_cast<int>(cols);
      gemm(ic, id, ir, 1.0f, l.p, ic, true, b.grad_out, id, false, 1.0f, dv_acc, id);
      gemm(ic, id, ir, 1.0f, l.ds, ic, true, b.q, id, false, 1.0f, dk_acc, id);
      if (fused) gemm(ir, id, ic, 1.0f, l.ds, ic, false, kb, id, false, 1.0f, dq_acc + (s.inner * g.seq_q + q0) * d, id);
    }
    if (s.last) {
      store_scaled(dk + kv_offset, dk_acc, cols * d, g.scale);
      store_scaled(dv + kv_offset, dv_acc, cols * d, 1.0f);
      if (fused && kvb == g.kv_blocks() - 1) store_scaled(dq + first_bh * g.seq_q * d, dq_acc, unit_rows * d, g.scale);
    }
  }
}

// The q pass on one core (two passes only): the dq blocks of its tiles (batch, head, q block).
template <class T>
void q_core(const BackwardInputs<T>& in, T* dq, const BackwardTiling& g, const Pipeline& p, int64_t core) {
  const int64_t qbs = g.q_blocks(), d = g.d, slots = p.buffer_num;
  std::vector<Step> steps;
  for (int64_t t = core; t < g.batch * g.heads * qbs; t += p.block_dim) {
    const int64_t n = (g.kv_end(t % qbs) + g.bkv - 1) / g.bkv, begin = static_cast<int64_t>(steps.size());
    for (int64_t kb = 0; kb < n; ++kb) steps.push_back({t, 0, kb, false, false});
    if (n == 0) steps.push_back({t, 0, -1, false, false});
    steps[begin].first = true;
    steps.back().last = true;
  }
  if (steps.empty()) return;
  const BackwardLocal l = allocate(g, slots);
  const int id = static_cast<int>(d);
  const float *qf = nullptr, *gf = nullptr;
  float* acc = nullptr;
  int64_t tile_index = -1;
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    const int64_t bh = s.tile / qbs, qb = s.tile % qbs, q0 = qb * g.bq, rows = std::min(g.bq, g.seq_q - q0);
    const int64_t q_offset = (bh * g.seq_q + q0) * d, end = g.kv_end(qb);
    const int64_t bkvh = (bh / g.heads) * g.kv_heads + (bh % g.heads) / g.group();
    const size_t ahead = i + p.pipeline_depth - 1;
    if (ahead > i && ahead < steps.size() && steps[ahead].block >= 0) {
      const Step& a = steps[ahead];
      const int64_t a_bh = a.tile / qbs, a_qb = a.tile % qbs, a_kv0 = a.block * g.bkv;
      const int64_t a_cols = std::min(g.bkv, g.kv_end(a_qb) - a_kv0);
      const int64_t a_offset = (((a_bh / g.heads) * g.kv_heads + (a_bh % g.heads) / g.group()) * g.seq_kv + a_kv0) * d;
      tiletune::prefetch(in.k + a_offset, a_cols * d * sizeof(T));
      tiletune::prefetch(in.v + a_offset, a_cols * d * sizeof(T));
      prefetch_mask(in.mask, g, a_bh, a_qb * g.bq, std::min(g.bq, g.seq_q - a_qb * g.bq), a_kv0, a_cols);
    }
    if (s.first) {
      ++tile_index;
      acc = l.accumulators(tile_index % slots);
      std::fill(acc, acc + rows * d, 0.0f);
      qf = as_float(in.q + q_offset, l.tiled(0), rows * d);
      gf = as_float(in.grad_out + q_offset, l.tiled(1), rows * d);
    }
    if (s.block >= 0) {
      const int64_t kv0 = s.block * g.bkv, cols = std::min(g.bkv, end - kv0), kv_offset = (bkvh * g.seq_kv + kv0) * d;
      const int64_t slot = static_cast<int64_t>(i) % slots;
      const BlockPair b{qf, gf, as_float(in.k + kv_offset, l.streamed(slot, 0), cols * d),
                        as_float(in.v + kv_offset, l.streamed(slot, 1), cols * d), bh, q0, rows, kv0, cols};
      recompute(l, in, g, b);
      const int ir = static_cast<int>(rows), ic = static_cast<int>(cols);
      gemm(ir, id, ic, 1.0f, l.ds, ic, false, b.k, id, false, 1.0f, acc, id);
    }
    if (s.last) store_scaled(dq + q_offset, acc, rows * d, g.scale);
  }
}

// D = rowsum(dO * O) of every query row, in float32; rows split over the cores in ranges.
template <class T>
void row_deltas(const T* grad_out, const T* out, float* delta, int64_t rows, int64_t d, int64_t block_dim) {
  tiletune::for_each_core(block_dim, [&](int64_t core) {
    const auto [begin, end] = tiletune::core_range(rows, block_dim, core);
    for (int64_t r = begin; r < end; ++r) {
      const T* a = grad_out + r * d;
      const T* b = out + r * d;
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t e = 0; e < d; ++e) sum += tiletune::to_float(a[e]) * tiletune::to_float(b[e]);
      delta[r] = sum;
    }
  });
}

void check_tensors(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                   const at::Tensor& lse, const at::Tensor& grad_out) {
  tiletune::check_attention_inputs(q, k, v);
  for (auto [t, name] : {std::pair{&out, "out"}, {&grad_out, "grad_out"}}) {
    tiletune::check_input(*t, name);
    TORCH_CHECK(t->scalar_type() == q.scalar_type(), name, " must have q's dtype ", q.scalar_type(), ", got ",
                t->scalar_type());
  }
  TORCH_CHECK(out.sizes() == q.sizes(), "out must have q's size ", q.sizes(), ", got ", out.sizes());
  TORCH_CHECK(grad_out.sizes() == q.sizes(), "grad_out must have q's size ", q.sizes(), ", got ", grad_out.sizes());
  tiletune::check_input(lse, "lse");
  TORCH_CHECK(lse.scalar_type() == at::kFloat, "lse must be float32, got ", lse.scalar_type());
  TORCH_CHECK(lse.sizes() == q.sizes().slice(0, 3), "lse must be [batch, heads, seq_q] = ", q.sizes().slice(0, 3),
              ", got ", lse.sizes());
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_attention_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& mask,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& grad_out, const std::optional<at::Tensor>& grad_lse,
    int64_t causal, double scale, int64_t block_q, int64_t block_kv, int64_t block_dim, int64_t buffer_num,
    int64_t pipeline_depth) {
  check_tensors(q, k, v, out, lse, grad_out);
  TORCH_CHECK(causal >= 0 && causal <= 2, "causal must be 0 (none), 1 (top-left) or 2 (bottom-right), got ",
              causal);
  TORCH_CHECK(std::isfinite(scale), "scale must be finite, got ", scale);
  TORCH_CHECK(block_q >= 1 && block_kv >= 1, "blocks must be >= 1, got block_q=", block_q, ", block_kv=",
              block_kv);
  const Pipeline p{block_dim, buffer_num, pipeline_depth};
  tiletune::check_pipeline(p);
  const bool masked = mask.has_value() && mask->defined();
  const std::array<int64_t, 4> strides = masked ? mask_strides(*mask, q, k.size(2)) : std::array<int64_t, 4>{};
  const BackwardTiling g{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), block_q, block_kv,
                         causal, static_cast<float>(scale)};
  auto dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  auto delta = at::empty({g.batch, g.heads, g.seq_q}, q.options().dtype(at::kFloat));
  if (grad_lse.has_value() && grad_lse->defined()) {
    TORCH_CHECK(grad_lse->sizes() == delta.sizes(), "grad_lse must be [batch, heads, seq_q] = ", delta.sizes(),
                ", got ", grad_lse->sizes());
  }
  if (q.numel() == 0 || k.numel() == 0) {
    dq.zero_();
    dk.zero_();
    dv.zero_();
    return {dq, dk, dv};
  }
  const bool fused = use_fused(g.units(), block_dim);
  // the fused pass's float32 dq accumulator: dq itself for float32
  const at::Tensor dq_work = fused && q.scalar_type() != at::kFloat ? at::empty(q.sizes(), q.options().dtype(at::kFloat)) : dq;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "native_attention_backward", [&] {
    const BackwardInputs<scalar_t> in{
        q.data_ptr<scalar_t>(),
        k.data_ptr<scalar_t>(),
        v.data_ptr<scalar_t>(),
        grad_out.data_ptr<scalar_t>(),
        lse.data_ptr<float>(),
        delta.data_ptr<float>(),
        MaskView<scalar_t>{masked ? mask->data_ptr<scalar_t>() : nullptr, strides[0], strides[1], strides[2],
                           strides[3]}};
    row_deltas(in.grad_out, out.data_ptr<scalar_t>(), delta.data_ptr<float>(), g.batch * g.heads * g.seq_q, g.d,
               block_dim);
    if (grad_lse.has_value() && grad_lse->defined()) delta.sub_(grad_lse->to(at::kFloat));  // D -= g_lse
    scalar_t* pdk = dk.data_ptr<scalar_t>();
    scalar_t* pdv = dv.data_ptr<scalar_t>();
    scalar_t* pdq = dq.data_ptr<scalar_t>();
    float* work = fused ? dq_work.data_ptr<float>() : nullptr;
    tiletune::for_each_core<true>(block_dim, [&](int64_t core) { kv_core(in, pdk, pdv, pdq, work, g, p, core); });
    if (!fused) tiletune::for_each_core<true>(block_dim, [&](int64_t core) { q_core(in, pdq, g, p, core); });
  });
  return {dq, dk, dv};
}
