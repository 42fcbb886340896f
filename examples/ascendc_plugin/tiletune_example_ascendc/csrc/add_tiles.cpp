// ascendc_add_tiles: z = x + y (float16) on the AI cores' vector units, in the structure of the Ascend C
// samples' AddCustom kernel (TPipe, one TQue per operand, CopyIn -> Compute -> CopyOut).
//
// TILE_LENGTH (elements per tile) and BUFFER_NUM (slots per queue: 2 = double buffering) are compile-time
// constants, given by the build (-DTILE_LENGTH=... -DBUFFER_NUM=...): each tiletune config is one build.
// blockDim (the AI cores) is the launch's run-time argument. The caller guarantees (the declaration's
// constraint) that `total` is a multiple of blockDim * TILE_LENGTH.
#include "kernel_operator.h"

#if !defined(TILE_LENGTH) || !defined(BUFFER_NUM)
#error "build with -DTILE_LENGTH=<elements> -DBUFFER_NUM=<slots>"
#endif

constexpr int32_t kTile = TILE_LENGTH;
constexpr int32_t kBuffers = BUFFER_NUM;

class KernelAddTiles {
 public:
  __aicore__ inline KernelAddTiles() {}
  __aicore__ inline void Init(GM_ADDR x, GM_ADDR y, GM_ADDR z, uint32_t total) {
    const uint32_t perCore = total / AscendC::GetBlockNum();
    const uint32_t offset = perCore * AscendC::GetBlockIdx();
    tiles_ = perCore / kTile;
    xGm_.SetGlobalBuffer((__gm__ half*)x + offset, perCore);
    yGm_.SetGlobalBuffer((__gm__ half*)y + offset, perCore);
    zGm_.SetGlobalBuffer((__gm__ half*)z + offset, perCore);
    pipe_.InitBuffer(inX_, kBuffers, kTile * sizeof(half));
    pipe_.InitBuffer(inY_, kBuffers, kTile * sizeof(half));
    pipe_.InitBuffer(outZ_, kBuffers, kTile * sizeof(half));
  }
  __aicore__ inline void Process() {
    for (uint32_t i = 0; i < tiles_; ++i) {
      CopyIn(i);
      Compute();
      CopyOut(i);
    }
  }

 private:
  __aicore__ inline void CopyIn(uint32_t i) {
    AscendC::LocalTensor<half> x = inX_.AllocTensor<half>();
    AscendC::LocalTensor<half> y = inY_.AllocTensor<half>();
    AscendC::DataCopy(x, xGm_[i * kTile], kTile);
    AscendC::DataCopy(y, yGm_[i * kTile], kTile);
    inX_.EnQue(x);
    inY_.EnQue(y);
  }
  __aicore__ inline void Compute() {
    AscendC::LocalTensor<half> x = inX_.DeQue<half>();
    AscendC::LocalTensor<half> y = inY_.DeQue<half>();
    AscendC::LocalTensor<half> z = outZ_.AllocTensor<half>();
    AscendC::Add(z, x, y, kTile);
    outZ_.EnQue<half>(z);
    inX_.FreeTensor(x);
    inY_.FreeTensor(y);
  }
  __aicore__ inline void CopyOut(uint32_t i) {
    AscendC::LocalTensor<half> z = outZ_.DeQue<half>();
    AscendC::DataCopy(zGm_[i * kTile], z, kTile);
    outZ_.FreeTensor(z);
  }

  AscendC::TPipe pipe_;
  AscendC::TQue<AscendC::QuePosition::VECIN, kBuffers> inX_, inY_;
  AscendC::TQue<AscendC::QuePosition::VECOUT, kBuffers> outZ_;
  AscendC::GlobalTensor<half> xGm_, yGm_, zGm_;
  uint32_t tiles_ = 0;
};

extern "C" __global__ __aicore__ void add_tiles(GM_ADDR x, GM_ADDR y, GM_ADDR z, uint32_t total) {
  KernelAddTiles op;
  op.Init(x, y, z, total);
  op.Process();
}

// Host side: launch on `stream` (an aclrtStream, e.g. torch_npu's current stream) over blockDim cores.
extern "C" void add_tiles_do(uint32_t blockDim, void* stream, uint8_t* x, uint8_t* y, uint8_t* z,
                             uint32_t total) {
  add_tiles<<<blockDim, nullptr, stream>>>(x, y, z, total);
}
