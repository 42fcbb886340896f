// An Ascend C style host tiling function for an elementwise add, with its tiles from tiletune.
//
// The host side of an Ascend C operator computes a TilingData (how the kernel cuts its work)
// and hands it to the kernel with the block dim. Here TilingFunc asks a tiletune table (a bundle
// exported by the server, or this node's disk cache) for the `native_add` kernel's config at
// the launch's shape and dtype, and falls back to the hand-written rule the seed's operator
// uses (DynamicTilingEngine: tiletune's `heuristic_tiling`), so an untuned shape launches exactly
// as before. Header-only C++17; the tiletune headers come from `tiletune-config --cflags`.
#pragma once

#include <tiletune/config.hpp>

#include <algorithm>
#include <cstdint>
#include <string_view>

namespace host_tiling {

//! What the kernel reads at launch (Ascend C's TilingData, as BEGIN_TILING_DATA_DEF declares it).
struct AddTilingData {
  std::uint32_t totalLength;    //!< elements of a, b and out
  std::uint32_t tileNum;        //!< tiles the elements are cut into
  std::uint32_t tileLength;     //!< elements per tile (the last tile may be shorter)
  std::uint32_t bufferNum;      //!< buffers per queue (2: double buffering)
  std::uint32_t pipelineDepth;  //!< tiles in flight through copy-in, compute, copy-out
  std::uint32_t blockDim;       //!< cores the tiles are spread over
};

//! The chip's limits the rule needs.
struct Platform {
  std::int64_t localMemoryBytes;  //!< unified buffer per core (a CPU: L2 per core)
  std::int64_t cores;             //!< AI cores (a CPU: threads)
};

//! The seed's hand-written rule (tiletune.kernels.declaration.heuristic_tiling): one tile up to
//! 1,024 elements; tiles of 256 double-buffered up to 65,536; else 1,024 (512 when two buffers of
//! it take more than a third of the local memory), double-buffered, three stages.
inline void SeedRule(std::int64_t total, std::int64_t elementBytes, std::int64_t localMemoryBytes,
                     std::int64_t& tile, std::int64_t& buffers, std::int64_t& depth) {
  if (total <= 1024) {
    tile = total, buffers = 1, depth = 1;
  } else if (total <= 65536) {
    tile = 256, buffers = 2, depth = 2;
  } else {
    tile = 1024, buffers = 2, depth = 3;
    if (tile * elementBytes * buffers > localMemoryBytes / 3) tile = 512;
  }
}

//! The block dim for `tiles` tiles on `cores` cores: the most of 1, 2, 4, ..., cores the tiles use
//! (tiletune.kernels.native.space.block_dim_for).
inline std::int64_t BlockDimFor(std::int64_t tiles, std::int64_t cores) {
  std::int64_t wanted = std::min(cores, tiles), best = 1;
  if (wanted >= cores) return cores;
  while (best * 2 <= wanted) best *= 2;
  return best;
}

inline std::int64_t ElementBytes(std::string_view dtype) { return dtype == "float32" ? 4 : 2; }

//! The tiling of an add of `total` elements of `dtype`: tiletune's answer where it has one for
//! this kernel (exact, or the nearest tuned shape's), the seed's rule for each knob it lacks.
//! `match` (optional) tells which. Never throws.
inline AddTilingData TilingFunc(const tiletune::Table& table, std::int64_t total, std::string_view dtype,
                                const Platform& platform, const char** match = nullptr) noexcept {
  std::int64_t tile = 0, buffers = 0, depth = 0;
  SeedRule(total, ElementBytes(dtype), platform.localMemoryBytes, tile, buffers, depth);
  tiletune::Answer answer = table.get("native_add", {{"n", total}}, dtype);
  tile = std::max<std::int64_t>(1, answer.get("tile_size", tile));
  std::int64_t tiles = total > 0 ? (total + tile - 1) / tile : 0;
  std::int64_t blockDim = answer.get("block_dim", BlockDimFor(std::max<std::int64_t>(tiles, 1), platform.cores));
  if (match != nullptr) *match = answer.match_name();
  return AddTilingData{static_cast<std::uint32_t>(total),
                       static_cast<std::uint32_t>(tiles),
                       static_cast<std::uint32_t>(tile),
                       static_cast<std::uint32_t>(answer.get("buffer_num", buffers)),
                       static_cast<std::uint32_t>(answer.get("pipeline_depth", depth)),
                       static_cast<std::uint32_t>(blockDim)};
}

}  // namespace host_tiling
