// Python bindings of the native kernels (the module name comes from the build: TORCH_EXTENSION_NAME).
#include <torch/python.h>

#include "native.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "tiletune native CPU kernels (Ascend-C-shaped: tiles over cores, buffered copy-in/out)";
  m.def("add", &native_add, "out = a + b, tiled");
  m.def("softmax", &native_softmax, "softmax over the last dim of rows x cols, tiled");
  m.def("rms_norm", &native_rms_norm, "x * rsqrt(mean(x^2) + eps) * w over rows x cols, tiled");
  m.def("rms_norm_backward", &native_rms_norm_backward,
        "rms_norm's gradients (dx, dw) over rows x cols, tiled; dw summed over rows in float32");
  m.def("softmax_backward", &native_softmax_backward,
        "softmax's gradient dx = y * (g - sum(g * y)) over rows x cols from the forward's output, tiled");
  m.def("matmul", &native_matmul, "C = A @ B, blocked over single-threaded sgemm_");
  m.def("attention", &native_attention,
        "attention forward with online softmax over kv blocks (GQA, causal alignments, mask, scale): "
        "(out, lse)");
  m.def("attention_backward", &native_attention_backward,
        "attention backward from the saved lse (a dk/dv pass over kv blocks, dq in it or in a second "
        "pass over q blocks; buffer_num slots, pipeline_depth prefetch): (dq, dk, dv)");
}
