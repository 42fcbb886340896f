// A torch C++ extension whose CPU add kernel takes its tiling from the host tiling function.
//
//   tiled_add(a, b, bundle)  -> a + b, cut into TilingData.tileNum tiles of tileLength elements,
//                               the tiles spread over blockDim threads (at::parallel_for)
//   tiling(n, dtype, bundle) -> [match, totalLength, tileNum, tileLength, bufferNum, pipelineDepth, blockDim]
//
// `bundle` is a bundle file (tiletune's export or disk cache); each path's table is read once and
// kept (a tiletune::Client per path; reload() would swap a new one in while launches go on).
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "tiling.hpp"

namespace {

const tiletune::Client& client_for(const std::string& bundle) {
  static std::mutex lock;
  static std::map<std::string, std::unique_ptr<tiletune::Client>> clients;
  std::lock_guard<std::mutex> guard(lock);
  auto& client = clients[bundle];
  if (!client) client = std::make_unique<tiletune::Client>(bundle);
  return *client;
}

host_tiling::AddTilingData tiling_of(std::int64_t n, const std::string& dtype, const std::string& bundle,
                                     const char** match) {
  const host_tiling::Platform platform{1 << 20, at::get_num_threads()};
  return host_tiling::TilingFunc(client_for(bundle).table(), n, dtype, platform, match);
}

std::string dtype_name(const torch::Tensor& t) {
  if (t.scalar_type() == torch::kFloat) return "float32";
  if (t.scalar_type() == torch::kHalf) return "float16";
  return "bfloat16";
}

}  // namespace

torch::Tensor tiled_add(const torch::Tensor& a, const torch::Tensor& b, const std::string& bundle) {
  TORCH_CHECK(a.device().is_cpu() && a.sizes() == b.sizes() && a.scalar_type() == torch::kFloat &&
                  b.scalar_type() == torch::kFloat,
              "tiled_add takes two CPU float32 tensors of one shape");
  torch::Tensor x = a.contiguous(), y = b.contiguous();
  torch::Tensor out = torch::empty_like(x);
  const char* match = "";
  const host_tiling::AddTilingData t = tiling_of(x.numel(), dtype_name(x), bundle, &match);
  const float* pa = x.data_ptr<float>();
  const float* pb = y.data_ptr<float>();
  float* po = out.data_ptr<float>();
  const std::int64_t tiles = t.tileNum, per_block = (tiles + t.blockDim - 1) / std::max<std::int64_t>(t.blockDim, 1);
  at::parallel_for(0, tiles, std::max<std::int64_t>(per_block, 1), [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t tile = first; tile < last; ++tile) {
      const std::int64_t begin = tile * t.tileLength;
      const std::int64_t end = std::min<std::int64_t>(begin + t.tileLength, t.totalLength);
      for (std::int64_t i = begin; i < end; ++i) po[i] = pa[i] + pb[i];
    }
  });
  return out;
}

std::vector<std::string> tiling(std::int64_t n, const std::string& dtype, const std::string& bundle) {
  const char* match = "";
  const host_tiling::AddTilingData t = tiling_of(n, dtype, bundle, &match);
  return {match, std::to_string(t.totalLength), std::to_string(t.tileNum), std::to_string(t.tileLength),
          std::to_string(t.bufferNum), std::to_string(t.pipelineDepth), std::to_string(t.blockDim)};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("tiled_add", &tiled_add, "a + b with the tiling of the host tiling function");
  m.def("tiling", &tiling, "the TilingData the host tiling function gives n elements of dtype");
}
