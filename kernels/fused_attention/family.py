"""``fused_attention``'s family: its declaration and its implementations (:mod:`tiletune.kernels.family`).

- ``torch``: the tiled PyTorch pipeline (``portable``), the family's own kernel ``fused_attention``;
- ``native``: the C++ kernel on CPUs (``native``), tuned as ``native_fused_attention``;
- ``triton``: the Triton kernel (``triton``), tuned as ``triton_fused_attention``.

torch's own op (``vendor``) is a config of each of them (``has_vendor``).
"""

from __future__ import annotations

from tiletune.kernels.declaration import PORTABLE_BACKEND
from tiletune.kernels.family import Family, Implementation
from tiletune.kernels.fused_attention.declaration import (
    FusedAttentionDeclaration,
    NativeFusedAttentionDeclaration,
    TritonFusedAttentionDeclaration,
)
from tiletune.kernels.native.space import NATIVE_BACKEND
from tiletune.kernels.triton.space import TRITON_BACKEND

FAMILY = Family(
    "fused_attention",
    (
        Implementation(
            PORTABLE_BACKEND, FusedAttentionDeclaration(), "tiletune.kernels.fused_attention.portable:SPEC"
        ),
        Implementation(
            NATIVE_BACKEND, NativeFusedAttentionDeclaration(), "tiletune.kernels.fused_attention.native:SPEC"
        ),
        Implementation(
            TRITON_BACKEND, TritonFusedAttentionDeclaration(), "tiletune.kernels.fused_attention.triton:SPEC"
        ),
    ),
)
