"""``fused_attention_backward``'s family (:mod:`tiletune.kernels.family`): the tiled PyTorch pipeline
(``portable``), the native C++ (``native``, tuned as ``native_fused_attention_backward``) and the Triton
kernel (``triton``, tuned as ``triton_fused_attention_backward``); torch's own op (``vendor``) is a
config of each."""

from __future__ import annotations

from tiletune.kernels.family import tiled_family
from tiletune.kernels.fused_attention_backward.declaration import (
    FusedAttentionBackwardDeclaration,
    NativeFusedAttentionBackwardDeclaration,
    TritonFusedAttentionBackwardDeclaration,
)

FAMILY = tiled_family(
    "tiletune.kernels.fused_attention_backward",
    FusedAttentionBackwardDeclaration(),
    NativeFusedAttentionBackwardDeclaration(),
    TritonFusedAttentionBackwardDeclaration(),
)
