"""``rms_norm``'s family (:mod:`tiletune.kernels.family`): the tiled PyTorch pipeline (``portable``),
the native C++ (``native``, tuned as ``native_rms_norm``) and the Triton kernel (``triton``, tuned as
``triton_rms_norm``); torch's own op (``vendor``) is a config of each."""

from __future__ import annotations

from tiletune.kernels.family import tiled_family
from tiletune.kernels.rms_norm.declaration import (
    NativeRmsNormDeclaration,
    RmsNormDeclaration,
    TritonRmsNormDeclaration,
)

FAMILY = tiled_family(
    "tiletune.kernels.rms_norm", RmsNormDeclaration(), NativeRmsNormDeclaration(), TritonRmsNormDeclaration()
)
