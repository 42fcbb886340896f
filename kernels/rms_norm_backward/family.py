"""``rms_norm_backward``'s family (:mod:`tiletune.kernels.family`): the tiled PyTorch pipeline
(``portable``), the native C++ (``native``, tuned as ``native_rms_norm_backward``) and the Triton kernel
(``triton``, tuned as ``triton_rms_norm_backward``); torch's own op (``vendor``) is a config of each."""

from __future__ import annotations

from tiletune.kernels.family import tiled_family
from tiletune.kernels.rms_norm_backward.declaration import (
    NativeRmsNormBackwardDeclaration,
    RmsNormBackwardDeclaration,
    TritonRmsNormBackwardDeclaration,
)

FAMILY = tiled_family(
    "tiletune.kernels.rms_norm_backward",
    RmsNormBackwardDeclaration(),
    NativeRmsNormBackwardDeclaration(),
    TritonRmsNormBackwardDeclaration(),
)
