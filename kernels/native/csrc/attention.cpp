// Attention forward, FlashAttention-2 style: O = softmax(Q K^T / sqrt(d) + mask) V.
//
// q [bh, seq_q, d], k and v [bh, seq_kv, d]. A tile is one block_q block of queries of one
// (batch, head); tiles are dealt to the cores round-robin (tile t to core t % block_dim, which
// balances the causal triangle). A tile's steps are the block_kv blocks of keys it attends to
// (causal: up to its last query, top-left aligned). A step copies the K and V blocks into their
// float32 slots (half/bfloat16; a float32 block is already a contiguous [block_kv, head_dim]
// matrix, which sgemm_ reads in place, so only its prefetch remains) and, first, the scaled Q
// block into its slot; it computes the scores with sgemm_, folds them into the
// tile's float32 accumulator with the online softmax (running max and sum; the accumulator is
// rescaled when the max grows) and adds P V with sgemm_; the last step divides by the sum and
// copies the block of O out.
#include <vector>

#include "native.h"

namespace {

using tiletune::Pipeline;

struct AttentionTiling {
  int64_t bh, seq_q, seq_kv, d, bq, bkv;
  bool causal;
  int64_t q_blocks() const { return (seq_q + bq - 1) / bq; }
  int64_t kv_end(int64_t qb) const {
    return causal ? std::min(seq_kv, std::min(seq_q, (qb + 1) * bq)) : seq_kv;
  }
  int64_t kv_steps(int64_t qb) const { return (kv_end(qb) + bkv - 1) / bkv; }
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
// sum and the factor the accumulator must be rescaled by. `valid(r)`: unmasked keys of row r.
template <class Valid>
void fold_scores(const AttentionLocal& l, int64_t rows, int64_t cols, bool first, const Valid& valid) {
  for (int64_t r = 0; r < rows; ++r) {
    float* s = l.scores + r * cols;
    const int64_t n = valid(r);
    if (n <= 0) {  // every key of this block is masked for this query
      std::fill(s, s + cols, 0.0f);
      l.rescale[r] = 1.0f;
      continue;
    }
    const float bm = tiletune::max_of(s, n);
    const float m = first ? bm : std::max(l.row_max[r], bm);
    l.rescale[r] = first ? 0.0f : tiletune::exp_approx(l.row_max[r] - m);
    l.row_max[r] = m;
    const float sum = tiletune::exp_shift_sum(s, m, s, n);
    std::fill(s + n, s + cols, 0.0f);
    l.row_sum[r] = first ? sum : l.row_sum[r] * l.rescale[r] + sum;
  }
}

template <class T>
void attention_core(const T* q, const T* k, const T* v, T* o, const AttentionTiling& g,
                    const Pipeline& p, int64_t core) {
  std::vector<std::pair<int64_t, int64_t>> steps;  // (tile, kv block) of this core, in order
  for (int64_t t = core; t < g.bh * g.q_blocks(); t += p.block_dim)
    for (int64_t kb = 0; kb < g.kv_steps(t % g.q_blocks()); ++kb) steps.emplace_back(t, kb);
  if (steps.empty()) return;
  const AttentionLocal l = allocate(g, p.buffer_num);
  const int64_t d = g.d, slots = p.buffer_num;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  int64_t tile_index = -1;
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto [tile, kb] = steps[i];
    const int64_t h = tile / g.q_blocks(), qb = tile % g.q_blocks();
    const int64_t q0 = qb * g.bq, rows = std::min(g.bq, g.seq_q - q0);
    const int64_t kv0 = kb * g.bkv, cols = std::min(g.bkv, g.kv_end(qb) - kv0);
    const bool first = kb == 0, last = kb == g.kv_steps(qb) - 1;
    const size_t ahead = i + p.pipeline_depth - 1;
    if (ahead > i && ahead < steps.size()) {  // issue a later step's K and V copy-in
      const auto [at, ak] = steps[ahead];
      const int64_t a0 = ak * g.bkv, an = std::min(g.bkv, g.kv_end(at % g.q_blocks()) - a0);
      const int64_t offset = ((at / g.q_blocks()) * g.seq_kv + a0) * d;
      tiletune::prefetch(k + offset, an * d * sizeof(T));
      tiletune::prefetch(v + offset, an * d * sizeof(T));
    }
    if (first) ++tile_index;
    const int64_t slot = static_cast<int64_t>(i) % slots, out_slot = tile_index % slots;
    float* lq = l.q + out_slot * g.bq * d;
    float* acc = l.acc + out_slot * g.bq * d;
    float* lk = l.k + slot * g.bkv * d;
    float* lv = l.v + slot * g.bkv * d;
    if (first) {  // copy-in of the Q block, pre-scaled
      const T* src = q + (h * g.seq_q + q0) * d;
#pragma omp simd
      for (int64_t e = 0; e < rows * d; ++e) lq[e] = tiletune::to_float(src[e]) * scale;
    }
    const int64_t kv_offset = (h * g.seq_kv + kv0) * d;
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
    if (g.causal) {
      fold_scores(l, rows, cols, first, [&](int64_t r) { return std::min(cols, q0 + r - kv0 + 1); });
    } else {
      fold_scores(l, rows, cols, first, [&](int64_t) { return cols; });
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
    if (last) {  // finish and copy-out
      T* dst = o + (h * g.seq_q + q0) * d;
      for (int64_t r = 0; r < rows; ++r) {
        const float inv = 1.0f / l.row_sum[r];
        const float* a = acc + r * d;
#pragma omp simd
        for (int64_t e = 0; e < d; ++e) dst[r * d + e] = static_cast<T>(a[e] * inv);
      }
    }
  }
}

}  // namespace

at::Tensor native_attention(const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, bool causal, int64_t block_q,
                               int64_t block_kv, int64_t block_dim, int64_t buffer_num,
                               int64_t pipeline_depth) {
  for (auto [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) {
    tiletune::check_input(*t, name);
    TORCH_CHECK(t->dim() == 3, name, " must be [batch*heads, seq, head_dim]");
    TORCH_CHECK(t->scalar_type() == q.scalar_type(), name, " must have q's dtype");
  }
  TORCH_CHECK(k.sizes() == v.sizes(), "k and v must have the same size");
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(2) == k.size(2), "q and k differ in batch*heads or head_dim");
  TORCH_CHECK(block_q >= 1 && block_kv >= 1, "blocks must be >= 1");
  Pipeline p{block_dim, buffer_num, pipeline_depth};
  tiletune::check_pipeline(p);
  AttentionTiling g{q.size(0), q.size(1), k.size(1), q.size(2), block_q, block_kv, causal};
  auto o = at::empty_like(q);
  if (o.numel() == 0) return o;
  TORCH_CHECK(g.seq_kv > 0, "seq_kv must be positive");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "native_attention", [&] {
    const scalar_t* pq = q.data_ptr<scalar_t>();
    const scalar_t* pk = k.data_ptr<scalar_t>();
    const scalar_t* pv = v.data_ptr<scalar_t>();
    scalar_t* po = o.data_ptr<scalar_t>();
    tiletune::for_each_core<true>(p.block_dim, [&](int64_t core) { attention_core(pq, pk, pv, po, g, p, core); });
  });
  return o;
}
