// Attention backward, FlashAttention-2 style: dq, dk and dv of O = softmax(scale * Q K^T + mask) V
// for the gradient of O alone (a gradient of the log-sum-exp is the caller's to fold into D).
//
// Shapes as the forward's (attention.cpp): q, out, grad_out [batch, heads, seq_q, d], k and v
// [batch, kv_heads, seq_kv, d] (query head h reads kv head h / (heads / kv_heads)), lse [batch,
// heads, seq_q] float32 natural log (-inf: the row sees no key, P = 0). The probabilities are
// recomputed from lse, never stored: P = exp(scale * Q K^T + mask - lse) on each row's visible
// keys (causal: j <= i + diagonal), 0 elsewhere; dP = dO V^T, dS = P * (dP - D) with
// D = rowsum(dO * O), computed once per row before the two passes.
//
// Pass 1 (dk, dv): a tile is one block_kv block of keys of one (batch, kv head), tiles dealt to
// the cores round-robin; it loops over the query heads of its group and the q blocks that see
// the block (causal: from the first query that sees its first key), accumulating dV += P^T dO
// and dK += scale * dS^T Q in float32. Pass 2 (dq): a tile is one block_q block of queries of one
// (batch, head), looping over the kv blocks it sees (the forward's bounds) with
// dQ += scale * dS K. Each output block is written by one tile: no atomics. Block products are
// single-threaded sgemm_; half/bfloat16 blocks are converted into float32 slots, float32 blocks
// are read in place.
#include <array>

#include "native.h"

namespace {

using tiletune::MaskView;
using tiletune::mask_strides;

struct BackwardTiling {
  int64_t batch, heads, kv_heads, seq_q, seq_kv, d, bq, bkv, block_dim;
  int64_t causal;  // 0 none, 1 top-left aligned, 2 bottom-right aligned
  float scale;
  int64_t q_blocks() const { return (seq_q + bq - 1) / bq; }
  int64_t kv_blocks() const { return (seq_kv + bkv - 1) / bkv; }
  int64_t group() const { return heads / kv_heads; }
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
};

template <class T>
struct BackwardInputs {
  const T *q, *k, *v, *grad_out;
  const float *lse, *delta;
  MaskView<T> mask;
};

// A core's local memory: float32 slots of the Q, dO, K and V blocks, the scores (then P) and
// dP (then dS) of one block pair, and the accumulators (dk and dv, or dq).
struct BackwardLocal {
  float *q, *grad_out, *k, *v, *p, *ds, *acc;
};

BackwardLocal allocate(const BackwardTiling& g) {
  const int64_t qt = g.bq * g.d, kvt = g.bkv * g.d, st = g.bq * g.bkv;
  const int64_t floats = 2 * qt + 2 * kvt + 2 * st + std::max(qt, 2 * kvt);
  float* base = static_cast<float*>(tiletune::local_memory(floats * sizeof(float)));
  BackwardLocal l;
  l.q = base;
  l.grad_out = l.q + qt;
  l.k = l.grad_out + qt;
  l.v = l.k + kvt;
  l.p = l.v + kvt;
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
  tiletune::gemm_rowmajor(ir, ic, id, b.q, id, b.k, id, true, 0.0f, l.p, ic);
  tiletune::gemm_rowmajor(ir, ic, id, b.grad_out, id, b.v, id, true, 0.0f, l.ds, ic);
  const float* lse = in.lse + b.bh * g.seq_q + b.q0;
  const float* delta = in.delta + b.bh * g.seq_q + b.q0;
  const int64_t diagonal = g.diagonal();
  for (int64_t r = 0; r < b.rows; ++r) {
    float* s = l.p + r * b.cols;
    float* ds = l.ds + r * b.cols;
    int64_t n = g.causal != 0 ? std::min(b.cols, b.q0 + r + diagonal - b.kv0 + 1) : b.cols;
    if (lse[r] == -INFINITY) n = 0;
    n = std::max<int64_t>(0, n);
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) s[j] *= g.scale;
    if (in.mask.data != nullptr && n > 0) {
      const T* m = in.mask.row(g.heads, b.bh, b.q0 + r) + b.kv0 * in.mask.key;
      for (int64_t j = 0; j < n; ++j) s[j] += tiletune::to_float(m[j * in.mask.key]);
    }
    if (n > 0) tiletune::exp_shift_sum(s, lse[r], s, n);
    std::fill(s + n, s + b.cols, 0.0f);
    const float dr = delta[r];
#pragma omp simd
    for (int64_t j = 0; j < b.cols; ++j) ds[j] = s[j] * (ds[j] - dr);
  }
}

// dst[i] = T(src[i] * factor) for i in [0, count).
template <class T>
void store_scaled(T* dst, const float* src, int64_t count, float factor) {
#pragma omp simd
  for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<T>(src[i] * factor);
}

// Pass 1 on one core: the dk and dv blocks of its tiles (batch, kv head, kv block).
template <class T>
void kv_core(const BackwardInputs<T>& in, T* dk, T* dv, const BackwardTiling& g, int64_t core) {
  const int64_t kvbs = g.kv_blocks(), tiles = g.batch * g.kv_heads * kvbs, d = g.d;
  if (core >= tiles) return;
  const BackwardLocal l = allocate(g);
  float* dk_acc = l.acc;
  float* dv_acc = l.acc + g.bkv * d;
  for (int64_t t = core; t < tiles; t += g.block_dim) {
    const int64_t bkvh = t / kvbs, kv0 = (t % kvbs) * g.bkv, cols = std::min(g.bkv, g.seq_kv - kv0);
    const int64_t kv_offset = (bkvh * g.seq_kv + kv0) * d;
    const float* kb = as_float(in.k + kv_offset, l.k, cols * d);
    const float* vb = as_float(in.v + kv_offset, l.v, cols * d);
    std::fill(dk_acc, dk_acc + cols * d, 0.0f);
    std::fill(dv_acc, dv_acc + cols * d, 0.0f);
    const int64_t batch = bkvh / g.kv_heads, first_head = (bkvh % g.kv_heads) * g.group();
    const int ic = static_cast<int>(cols), id = static_cast<int>(d);
    for (int64_t h = first_head; h < first_head + g.group(); ++h) {
      const int64_t bh = batch * g.heads + h;
      for (int64_t qb = g.first_q_block(kv0); qb < g.q_blocks(); ++qb) {
        const int64_t q0 = qb * g.bq, rows = std::min(g.bq, g.seq_q - q0);
        const int64_t q_offset = (bh * g.seq_q + q0) * d;
        const BlockPair b{as_float(in.q + q_offset, l.q, rows * d),
                          as_float(in.grad_out + q_offset, l.grad_out, rows * d), kb, vb, bh, q0, rows, kv0, cols};
        recompute(l, in, g, b);
        const int ir = static_cast<int>(rows);
        tiletune::gemm_rowmajor(ic, id, ir, l.p, ic, true, b.grad_out, id, false, 1.0f, dv_acc, id);
        tiletune::gemm_rowmajor(ic, id, ir, l.ds, ic, true, b.q, id, false, 1.0f, dk_acc, id);
      }
    }
    store_scaled(dk + kv_offset, dk_acc, cols * d, g.scale);
    store_scaled(dv + kv_offset, dv_acc, cols * d, 1.0f);
  }
}

// Pass 2 on one core: the dq blocks of its tiles (batch, head, q block).
template <class T>
void q_core(const BackwardInputs<T>& in, T* dq, const BackwardTiling& g, int64_t core) {
  const int64_t qbs = g.q_blocks(), tiles = g.batch * g.heads * qbs, d = g.d;
  if (core >= tiles) return;
  const BackwardLocal l = allocate(g);
  const int id = static_cast<int>(d);
  for (int64_t t = core; t < tiles; t += g.block_dim) {
    const int64_t bh = t / qbs, qb = t % qbs, q0 = qb * g.bq, rows = std::min(g.bq, g.seq_q - q0);
    const int64_t q_offset = (bh * g.seq_q + q0) * d, end = g.kv_end(qb);
    const float* qf = as_float(in.q + q_offset, l.q, rows * d);
    const float* gf = as_float(in.grad_out + q_offset, l.grad_out, rows * d);
    std::fill(l.acc, l.acc + rows * d, 0.0f);
    const int64_t bkvh = (bh / g.heads) * g.kv_heads + (bh % g.heads) / g.group();
    for (int64_t kv0 = 0; kv0 < end; kv0 += g.bkv) {
      const int64_t cols = std::min(g.bkv, end - kv0), kv_offset = (bkvh * g.seq_kv + kv0) * d;
      const BlockPair b{qf, gf, as_float(in.k + kv_offset, l.k, cols * d), as_float(in.v + kv_offset, l.v, cols * d),
                        bh, q0, rows, kv0, cols};
      recompute(l, in, g, b);
      const int ir = static_cast<int>(rows), ic = static_cast<int>(cols);
      tiletune::gemm_rowmajor(ir, id, ic, l.ds, ic, b.k, id, false, 1.0f, l.acc, id);
    }
    store_scaled(dq + q_offset, l.acc, rows * d, g.scale);
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
    int64_t causal, double scale, int64_t block_q, int64_t block_kv, int64_t block_dim) {
  check_tensors(q, k, v, out, lse, grad_out);
  TORCH_CHECK(causal >= 0 && causal <= 2, "causal must be 0 (none), 1 (top-left) or 2 (bottom-right), got ",
              causal);
  TORCH_CHECK(std::isfinite(scale), "scale must be finite, got ", scale);
  TORCH_CHECK(block_q >= 1 && block_kv >= 1, "blocks must be >= 1, got block_q=", block_q, ", block_kv=",
              block_kv);
  TORCH_CHECK(block_dim >= 1, "block_dim must be >= 1, got ", block_dim);
  const bool masked = mask.has_value() && mask->defined();
  const std::array<int64_t, 4> strides = masked ? mask_strides(*mask, q, k.size(2)) : std::array<int64_t, 4>{};
  const BackwardTiling g{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), block_q, block_kv,
                         block_dim, causal, static_cast<float>(scale)};
  auto dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  auto delta = at::empty({g.batch, g.heads, g.seq_q}, q.options().dtype(at::kFloat));
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
    if (grad_lse.has_value() && grad_lse->defined()) {  // dS = P (dP - D + g_lse): fold g_lse into D
      TORCH_CHECK(grad_lse->sizes() == delta.sizes(), "grad_lse must be [batch, heads, seq_q] = ", delta.sizes(),
                  ", got ", grad_lse->sizes());
      delta.sub_(grad_lse->to(at::kFloat));
    }
    scalar_t* pdk = dk.data_ptr<scalar_t>();
    scalar_t* pdv = dv.data_ptr<scalar_t>();
    scalar_t* pdq = dq.data_ptr<scalar_t>();
    tiletune::for_each_core<true>(block_dim, [&](int64_t core) { kv_core(in, pdk, pdv, g, core); });
    tiletune::for_each_core<true>(block_dim, [&](int64_t core) { q_core(in, pdq, g, core); });
  });
  return {dq, dk, dv};
}
