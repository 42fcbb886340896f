// Attention forward, FlashAttention-2 style: O = softmax(scale * Q K^T + mask) V, and the
// natural-log log-sum-exp of each query row's scaled, masked scores.
//
// q [batch, heads, seq_q, d], k and v [batch, kv_heads, seq_kv, d] (grouped-query attention:
// query head h reads kv head h / (heads / kv_heads), never a copy of k and v). A tile is one
// block_q block of queries of one (batch, head); tiles are dealt to the cores round-robin (tile
// t to core t % block_dim, which balances the causal triangle). A tile's steps are the block_kv
// blocks of keys it attends to (causal: up to the key its last query sees, top-left or
// bottom-right aligned; a tile that sees no key has no steps). A step copies the K and V blocks
// into their float32 slots (half/bfloat16; a float32 block is already a contiguous
// [block_kv, head_dim] matrix, which sgemm_ reads in place, so only its prefetch remains) and,
// first, the scaled Q block into its slot; it computes the scores with sgemm_, adds the mask
// block (read through its strides), folds them into the tile's float32 accumulator with the
// online softmax (running max and sum; the accumulator is rescaled when the max grows) and
// adds P V with sgemm_; the last step divides by the sum and copies the block of O and its
// log-sum-exp out. A row with no visible key gets O = 0 and log-sum-exp -inf.
#include <array>
#include <vector>

#include "native.h"

namespace {

using tiletune::MaskView;
using tiletune::Pipeline;
using tiletune::mask_strides;

struct AttentionTiling {
  int64_t batch, heads, kv_heads, seq_q, seq_kv, d, bq, bkv;
  int64_t causal;  // 0 none, 1 top-left aligned, 2 bottom-right aligned
  float scale;
  int64_t q_blocks() const { return (seq_q + bq - 1) / bq; }
  int64_t tiles() const { return batch * heads * q_blocks(); }
  // Query i sees keys j <= i + diagonal() (causal).
  int64_t diagonal() const { return causal == 2 ? seq_kv - seq_q : 0; }
  int64_t kv_end(int64_t qb) const {
    if (causal == 0) return seq_kv;
    const int64_t end = std::min(seq_q, (qb + 1) * bq) + diagonal();
    return std::max<int64_t>(0, std::min(seq_kv, end));
  }
  int64_t kv_steps(int64_t qb) const { return (kv_end(qb) + bkv - 1) / bkv; }
  // The flat (batch, kv head) of the flat (batch, head) `bh`.
  int64_t kv_index(int64_t bh) const {
    return (bh / heads) * kv_heads + (bh % heads) / (heads / kv_heads);
  }
};

struct AttentionLocal {
  float *q, *k, *v, *acc, *scores, *row_max, *row_sum, *rescale;
};

AttentionLocal allocate(const AttentionTiling& g, int64_t slots) {
  const int64_t qt = g.bq * g.d, kvt = g.bkv * g.d;
  const int64_t floats = slots * (2 * qt + 2 * kvt) + g.bq * g.bkv + 3 * g.bq;
  float* base = static_cast<float*>(tiletune::local_memory(floats * sizeof(float)));
  AttentionLocal l;
  l.q = base;
  l.acc = l.q + slots * qt;
  l.k = l.acc + slots * qt;
  l.v = l.k + slots * kvt;
  l.scores = l.v + slots * kvt;
  l.row_max = l.scores + g.bq * g.bkv;
  l.row_sum = l.row_max + g.bq;
  l.rescale = l.row_sum + g.bq;
  return l;
}

// Online softmax of one step's scores [rows, cols] in place (scores become P); keeps row max,
// sum and the factor the accumulator must be rescaled by. `valid(r)`: the visible keys of row r
// (a prefix of the block; <= 0: none). A row whose keys so far are all masked (max -inf) keeps
// max -inf and sum 0, with P = 0.
template <class Valid>
void fold_scores(const AttentionLocal& l, int64_t rows, int64_t cols, bool first, const Valid& valid) {
  for (int64_t r = 0; r < rows; ++r) {
    float* s = l.scores + r * cols;
    const int64_t n = std::max<int64_t>(0, valid(r));
    const float old = first ? -INFINITY : l.row_max[r];
    const float m = n > 0 ? std::max(old, tiletune::max_of(s, n)) : old;
    if (m == -INFINITY) {  // no visible key yet: P = 0, the accumulator stays 0
      std::fill(s, s + cols, 0.0f);
      l.rescale[r] = 1.0f;
      l.row_max[r] = -INFINITY;
      l.row_sum[r] = 0.0f;
      continue;
    }
    l.rescale[r] = old == -INFINITY ? 0.0f : tiletune::exp_approx(old - m);
    l.row_max[r] = m;
    const float sum = n > 0 ? tiletune::exp_shift_sum(s, m, s, n) : 0.0f;
    std::fill(s + n, s + cols, 0.0f);
    l.row_sum[r] = first ? sum : l.row_sum[r] * l.rescale[r] + sum;
  }
}

// scores[r, j] += mask[q0 + r, kv0 + j] for the visible keys of each row.
template <class T, class Valid>
void add_mask(float* scores, int64_t rows, int64_t cols, const MaskView<T>& mask, const AttentionTiling& g,
              int64_t bh, int64_t q0, int64_t kv0, const Valid& valid) {
  for (int64_t r = 0; r < rows; ++r) {
    float* s = scores + r * cols;
    const int64_t n = std::min(cols, valid(r));
    const T* m = mask.row(g.heads, bh, q0 + r) + kv0 * mask.key;
    if (mask.key == 1) {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) s[j] += tiletune::to_float(m[j]);
    } else {
      for (int64_t j = 0; j < n; ++j) s[j] += tiletune::to_float(m[j * mask.key]);
    }
  }
}

// Copy-out of a finished tile: O = acc / sum (0 without a visible key), lse = max + log(sum).
template <class T>
void store_rows(const AttentionLocal& l, const float* acc, int64_t rows, int64_t d, T* dst, float* lse) {
  for (int64_t r = 0; r < rows; ++r) {
    const float sum = l.row_sum[r];
    const bool none = !(sum > 0.0f);
    const float inv = none ? 0.0f : 1.0f / sum;
    const float* a = acc + r * d;
    T* o = dst + r * d;
    if (none) {
      std::fill(o, o + d, static_cast<T>(0.0f));
    } else {
#pragma omp simd
      for (int64_t e = 0; e < d; ++e) o[e] = static_cast<T>(a[e] * inv);
    }
    lse[r] = none ? -INFINITY : l.row_max[r] + std::log(sum);
  }
}

// Issue step `step`'s copy-in (its K, V and mask blocks) as prefetches.
template <class T>
void prefetch_step(const T* k, const T* v, const MaskView<T>& mask, const AttentionTiling& g,
                   std::pair<int64_t, int64_t> step) {
  const auto [tile, kb] = step;
  const int64_t bh = tile / g.q_blocks(), qb = tile % g.q_blocks();
  const int64_t a0 = kb * g.bkv, an = std::min(g.bkv, g.kv_end(qb) - a0);
  const int64_t offset = (g.kv_index(bh) * g.seq_kv + a0) * g.d;
  tiletune::prefetch(k + offset, an * g.d * sizeof(T));
  tiletune::prefetch(v + offset, an * g.d * sizeof(T));
  if (mask.data != nullptr && mask.key == 1) {
    const int64_t q0 = qb * g.bq, rows = std::min(g.bq, g.seq_q - q0);
    for (int64_t r = 0; r < rows; ++r) tiletune::prefetch(mask.row(g.heads, bh, q0 + r) + a0, an * sizeof(T));
  }
}

template <class T>
void attention_core(const T* q, const T* k, const T* v, const MaskView<T>& mask, T* o, float* lse,
                    const AttentionTiling& g, const Pipeline& p, int64_t core) {
  const int64_t d = g.d, slots = p.buffer_num, qbs = g.q_blocks();
  std::vector<std::pair<int64_t, int64_t>> steps;  // (tile, kv block) of this core, in order
  for (int64_t t = core; t < g.tiles(); t += p.block_dim) {
    const int64_t n = g.kv_steps(t % qbs);
    for (int64_t kb = 0; kb < n; ++kb) steps.emplace_back(t, kb);
    if (n == 0) {  // no query of this tile sees a key: O = 0, lse = -inf
      const int64_t q0 = (t % qbs) * g.bq, rows = std::min(g.bq, g.seq_q - q0);
      const int64_t row0 = (t / qbs) * g.seq_q + q0;
      std::fill(o + row0 * d, o + (row0 + rows) * d, static_cast<T>(0.0f));
      std::fill(lse + row0, lse + row0 + rows, -INFINITY);
    }
  }
  if (steps.empty()) return;
  const AttentionLocal l = allocate(g, p.buffer_num);
  const int64_t diagonal = g.diagonal();
  int64_t tile_index = -1;
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto [tile, kb] = steps[i];
    const int64_t bh = tile / qbs, qb = tile % qbs;
    const int64_t q0 = qb * g.bq, rows = std::min(g.bq, g.seq_q - q0);
    const int64_t kv0 = kb * g.bkv, cols = std::min(g.bkv, g.kv_end(qb) - kv0);
    const bool first = kb == 0, last = kb == g.kv_steps(qb) - 1;
    const size_t ahead = i + p.pipeline_depth - 1;
    if (ahead > i && ahead < steps.size()) prefetch_step(k, v, mask, g, steps[ahead]);
    if (first) ++tile_index;
    const int64_t slot = static_cast<int64_t>(i) % slots, out_slot = tile_index % slots;
    float* lq = l.q + out_slot * g.bq * d;
    float* acc = l.acc + out_slot * g.bq * d;
    if (first) {  // copy-in of the Q block, pre-scaled
      const T* src = q + (bh * g.seq_q + q0) * d;
#pragma omp simd
      for (int64_t e = 0; e < rows * d; ++e) lq[e] = tiletune::to_float(src[e]) * g.scale;
    }
    const int64_t kv_offset = (g.kv_index(bh) * g.seq_kv + kv0) * d;
    float* lk = l.k + slot * g.bkv * d;
    float* lv = l.v + slot * g.bkv * d;
    const float* kb_ = lk;
    const float* vb_ = lv;
    if constexpr (std::is_same_v<T, float>) {  // already contiguous float32 [cols, d]: no copy
      kb_ = k + kv_offset;
      vb_ = v + kv_offset;
    } else {
      tiletune::load_float(lk, k + kv_offset, cols * d);
      tiletune::load_float(lv, v + kv_offset, cols * d);
    }
    const int ir = static_cast<int>(rows), ic = static_cast<int>(cols), id = static_cast<int>(d);
    tiletune::gemm_rowmajor(ir, ic, id, lq, id, kb_, id, true, 0.0f, l.scores, ic);
    const auto causal_valid = [&](int64_t r) { return std::min(cols, q0 + r + diagonal - kv0 + 1); };
    const auto all_valid = [&](int64_t) { return cols; };
    if (g.causal != 0) {
      if (mask.data != nullptr) add_mask(l.scores, rows, cols, mask, g, bh, q0, kv0, causal_valid);
      fold_scores(l, rows, cols, first, causal_valid);
    } else {
      if (mask.data != nullptr) add_mask(l.scores, rows, cols, mask, g, bh, q0, kv0, all_valid);
      fold_scores(l, rows, cols, first, all_valid);
    }
    if (!first) {
      for (int64_t r = 0; r < rows; ++r) {
        float* a = acc + r * d;
        const float f = l.rescale[r];
#pragma omp simd
        for (int64_t e = 0; e < d; ++e) a[e] *= f;
      }
    }
    tiletune::gemm_rowmajor(ir, id, ic, l.scores, ic, vb_, id, false, first ? 0.0f : 1.0f, acc, id);
    if (last) store_rows(l, acc, rows, d, o + (bh * g.seq_q + q0) * d, lse + bh * g.seq_q + q0);
  }
}


}  // namespace

std::tuple<at::Tensor, at::Tensor> native_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                    const std::optional<at::Tensor>& mask, int64_t causal,
                                                    double scale, int64_t block_q, int64_t block_kv,
                                                    int64_t block_dim, int64_t buffer_num, int64_t pipeline_depth) {
  tiletune::check_attention_inputs(q, k, v);
  TORCH_CHECK(causal >= 0 && causal <= 2, "causal must be 0 (none), 1 (top-left) or 2 (bottom-right), got ",
              causal);
  TORCH_CHECK(std::isfinite(scale), "scale must be finite, got ", scale);
  TORCH_CHECK(block_q >= 1 && block_kv >= 1, "blocks must be >= 1, got block_q=", block_q, ", block_kv=",
              block_kv);
  Pipeline p{block_dim, buffer_num, pipeline_depth};
  tiletune::check_pipeline(p);
  const bool masked = mask.has_value() && mask->defined();
  const std::array<int64_t, 4> strides = masked ? mask_strides(*mask, q, k.size(2)) : std::array<int64_t, 4>{};
  AttentionTiling g{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), block_q, block_kv, causal,
                    static_cast<float>(scale)};
  auto o = at::empty_like(q);
  auto lse = at::empty({g.batch, g.heads, g.seq_q}, q.options().dtype(at::kFloat));
  if (o.numel() == 0) return {o, lse};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "native_attention", [&] {
    const MaskView<scalar_t> view{masked ? mask->data_ptr<scalar_t>() : nullptr, strides[0], strides[1],
                                  strides[2], strides[3]};
    const scalar_t* pq = q.data_ptr<scalar_t>();
    const scalar_t* pk = k.data_ptr<scalar_t>();
    const scalar_t* pv = v.data_ptr<scalar_t>();
    scalar_t* po = o.data_ptr<scalar_t>();
    float* pl = lse.data_ptr<float>();
    tiletune::for_each_core<true>(p.block_dim, [&](int64_t core) {
      attention_core(pq, pk, pv, view, po, pl, g, p, core);
    });
  });
  return {o, lse};
}
