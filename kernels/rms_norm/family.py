"""``rms_norm``'s family: its declaration and its implementations (:mod:`tiletune.kernels.family`).

- ``torch``: the tiled PyTorch pipeline (``portable``), the family's own kernel ``rms_norm``;
- ``native``: the C++ kernel on CPUs (``native``), tuned as ``native_rms_norm``;
- ``triton``: the Triton kernel (``triton``), tuned as ``triton_rms_norm``.

torch's own op (``vendor``) is a config of each of them (``has_vendor``).
"""

from __future__ import annotations

from tiletune.kernels.declaration import PORTABLE_BACKEND
from tiletune.kernels.family import Family, Implementation
from tiletune.kernels.native.space import NATIVE_BACKEND
from tiletune.kernels.rms_norm.declaration import (
    NativeRmsNormDeclaration,
    RmsNormDeclaration,
    TritonRmsNormDeclaration,
)
from tiletune.kernels.triton.space import TRITON_BACKEND

FAMILY = Family(
    "rms_norm",
    (
        Implementation(PORTABLE_BACKEND, RmsNormDeclaration(), "tiletune.kernels.rms_norm.portable:SPEC"),
        Implementation(NATIVE_BACKEND, NativeRmsNormDeclaration(), "tiletune.kernels.rms_norm.native:SPEC"),
        Implementation(TRITON_BACKEND, TritonRmsNormDeclaration(), "tiletune.kernels.rms_norm.triton:SPEC"),
    ),
)
