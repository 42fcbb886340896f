"""``fused_attention_backward``'s family: its declaration and implementations (``kernels/family.py``).

- ``torch``: the tiled PyTorch pipeline (``portable``), the family's own kernel;
- ``native``: the C++ kernel on CPUs (``native``), tuned as ``native_fused_attention_backward``;
- ``triton``: the Triton kernel (``triton``), tuned as ``triton_fused_attention_backward``.

torch's own op (``vendor``) is a config of each of them (``has_vendor``).
"""

from __future__ import annotations

from tiletune.kernels.declaration import PORTABLE_BACKEND
from tiletune.kernels.family import Family, Implementation
from tiletune.kernels.fused_attention_backward.declaration import (
    FusedAttentionBackwardDeclaration,
    NativeFusedAttentionBackwardDeclaration,
    TritonFusedAttentionBackwardDeclaration,
)
from tiletune.kernels.native.space import NATIVE_BACKEND
from tiletune.kernels.triton.space import TRITON_BACKEND

FAMILY = Family(
    "fused_attention_backward",
    (
        Implementation(
            PORTABLE_BACKEND,
            FusedAttentionBackwardDeclaration(),
            "tiletune.kernels.fused_attention_backward.portable:SPEC",
        ),
        Implementation(
            NATIVE_BACKEND,
            NativeFusedAttentionBackwardDeclaration(),
            "tiletune.kernels.fused_attention_backward.native:SPEC",
        ),
        Implementation(
            TRITON_BACKEND,
            TritonFusedAttentionBackwardDeclaration(),
            "tiletune.kernels.fused_attention_backward.triton:SPEC",
        ),
    ),
)
