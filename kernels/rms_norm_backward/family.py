"""``rms_norm_backward``'s family: its declaration and its implementations (:mod:`tiletune.kernels.family`).

- ``torch``: the tiled PyTorch pipeline (``portable``), the family's own kernel ``rms_norm_backward``;
- ``native``: the C++ kernel on CPUs (``native``), tuned as ``native_rms_norm_backward``;
- ``triton``: the Triton kernel (``triton``), tuned as ``triton_rms_norm_backward``.

torch's own op (``vendor``) is a config of each of them (``has_vendor``).
"""

from __future__ import annotations

from tiletune.kernels.declaration import PORTABLE_BACKEND
from tiletune.kernels.family import Family, Implementation
from tiletune.kernels.native.space import NATIVE_BACKEND
from tiletune.kernels.rms_norm_backward.declaration import (
    NativeRmsNormBackwardDeclaration,
    RmsNormBackwardDeclaration,
    TritonRmsNormBackwardDeclaration,
)
from tiletune.kernels.triton.space import TRITON_BACKEND

FAMILY = Family(
    "rms_norm_backward",
    (
        Implementation(
            PORTABLE_BACKEND, RmsNormBackwardDeclaration(), "tiletune.kernels.rms_norm_backward.portable:SPEC"
        ),
        Implementation(
            NATIVE_BACKEND,
            NativeRmsNormBackwardDeclaration(),
            "tiletune.kernels.rms_norm_backward.native:SPEC",
        ),
        Implementation(
            TRITON_BACKEND,
            TritonRmsNormBackwardDeclaration(),
            "tiletune.kernels.rms_norm_backward.triton:SPEC",
        ),
    ),
)
