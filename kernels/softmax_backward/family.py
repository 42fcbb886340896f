"""``softmax_backward``'s family (:mod:`tiletune.kernels.family`): the tiled PyTorch pipeline
(``portable``), the native C++ (``native``, tuned as ``native_softmax_backward``) and the Triton kernel
(``triton``, tuned as ``triton_softmax_backward``); torch's own op (``vendor``) is a config of each."""

from __future__ import annotations

from tiletune.kernels.family import tiled_family
from tiletune.kernels.softmax_backward.declaration import (
    NativeSoftmaxBackwardDeclaration,
    SoftmaxBackwardDeclaration,
    TritonSoftmaxBackwardDeclaration,
)

FAMILY = tiled_family(
    "tiletune.kernels.softmax_backward",
    SoftmaxBackwardDeclaration(),
    NativeSoftmaxBackwardDeclaration(),
    TritonSoftmaxBackwardDeclaration(),
)
