// Prints the TilingData the host tiling function gives a few shapes:
//   host_tiling [BUNDLE] [CHIP]    (default: this node's disk cache of CHIP)
// One line per shape: n dtype match totalLength tileNum tileLength bufferNum pipelineDepth blockDim.
#include <cstdio>
#include <string>

#include "tiling.hpp"

int main(int argc, char** argv) {
  std::string chip = argc > 2 ? argv[2] : "";
  std::string path = argc > 1 ? argv[1] : tiletune::disk_cache_path(chip);
  tiletune::Table table = tiletune::Table::load(path, chip);
  std::printf("# %s: %s\n", path.c_str(), table.ok() ? "read" : std::string(table.error()).c_str());
  const host_tiling::Platform platform{1 << 20, 8};
  for (std::int64_t n : {100, 1024, 4096, 5000, 65536, 1 << 20, 3000000}) {
    for (const char* dtype : {"float32", "float16"}) {
      const char* match = "";
      host_tiling::AddTilingData t = host_tiling::TilingFunc(table, n, dtype, platform, &match);
      std::printf("%lld %s %s %u %u %u %u %u %u\n", static_cast<long long>(n), dtype, match, t.totalLength, t.tileNum,
                  t.tileLength, t.bufferNum, t.pipelineDepth, t.blockDim);
    }
  }
  return 0;
}
