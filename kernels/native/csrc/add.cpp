// add: out = a + b over n elements, tile_size elements per tile, two input queues (a, b).
//
// Each element is read once, so a slot holds no data worth keeping: float32 tiles are consumed
// straight from global memory, their copy-in being the prefetch issued pipeline_depth - 1 tiles
// ahead (registers are the local buffer; buffer_num has no effect). Half and bfloat16 tiles are
// copied in with their conversion to float32 into slot t % buffer_num of each input queue.
// Compute is fused with copy-out: the float32 sums go straight into `out` (streaming stores when
// the output is larger than the last-level cache); there is no output slot.
#include "native.h"

namespace {

using tiletune::Pipeline;

template <class T>
void add_core(const T* a, const T* b, T* out, int64_t n, int64_t tile, const Pipeline& p,
              int64_t core) {
  const int64_t tiles = (n + tile - 1) / tile;
  auto [first, last] = tiletune::core_range(tiles, p.block_dim, core);
  if (first >= last) return;
  const int64_t slots = p.buffer_num;
  const bool stream = static_cast<size_t>(n) * sizeof(T) > tiletune::streaming_bytes();
  float* local = std::is_same_v<T, float>
                     ? nullptr
                     : static_cast<float*>(tiletune::local_memory(2 * slots * tile * sizeof(float)));
  auto length = [&](int64_t t) { return std::min(tile, n - t * tile); };
  for (int64_t t = first; t < last; ++t) {
    const int64_t ahead = t + p.pipeline_depth - 1;
    if (ahead > t && ahead < last) {
      tiletune::prefetch(a + ahead * tile, length(ahead) * sizeof(T));
      tiletune::prefetch(b + ahead * tile, length(ahead) * sizeof(T));
    }
    const int64_t len = length(t);
    if constexpr (std::is_same_v<T, float>) {
      const float* __restrict__ ta = a + t * tile;
      const float* __restrict__ tb = b + t * tile;
      tiletune::store_each(out + t * tile, len, stream, [&](int64_t i) { return ta[i] + tb[i]; });
    } else {
      const int64_t slot = (t - first) % slots;
      float* __restrict__ la = local + slot * tile;
      float* __restrict__ lb = local + (slots + slot) * tile;
      tiletune::load_float(la, a + t * tile, len);  // copy-in, converting to float32
      tiletune::load_float(lb, b + t * tile, len);
      // compute, fused with copy-out
      tiletune::store_each(out + t * tile, len, stream, [&](int64_t i) { return la[i] + lb[i]; });
    }
  }
  if (stream) tiletune::stream_fence();
}

}  // namespace

at::Tensor native_add(const at::Tensor& a, const at::Tensor& b, int64_t tile_size,
                         int64_t block_dim, int64_t buffer_num, int64_t pipeline_depth) {
  tiletune::check_input(a, "a");
  tiletune::check_input(b, "b");
  TORCH_CHECK(a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type(),
              "a and b must have the same size and dtype");
  TORCH_CHECK(tile_size >= 1, "tile_size must be >= 1");
  Pipeline p{block_dim, buffer_num, pipeline_depth};
  tiletune::check_pipeline(p);
  auto out = at::empty_like(a);
  const int64_t n = a.numel();
  if (n == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "native_add", [&] {
    const scalar_t* pa = a.data_ptr<scalar_t>();
    const scalar_t* pb = b.data_ptr<scalar_t>();
    scalar_t* po = out.data_ptr<scalar_t>();
    tiletune::for_each_core(p.block_dim,
                            [&](int64_t core) { add_core(pa, pb, po, n, tile_size, p, core); });
  });
  return out;
}
