"""``softmax``'s family: its declaration and its implementations (:mod:`tiletune.kernels.family`).

- ``torch``: the tiled PyTorch pipeline (``portable``), the family's own kernel ``softmax``;
- ``native``: the C++ kernel on CPUs (``native``), tuned as ``native_softmax``;
- ``triton``: the Triton kernel (``triton``), tuned as ``triton_softmax``.

torch's own op (``vendor``) is a config of each of them (``has_vendor``).
"""

from __future__ import annotations

from tiletune.kernels.declaration import PORTABLE_BACKEND
from tiletune.kernels.family import Family, Implementation
from tiletune.kernels.native.space import NATIVE_BACKEND
from tiletune.kernels.softmax.declaration import (
    NativeSoftmaxDeclaration,
    SoftmaxDeclaration,
    TritonSoftmaxDeclaration,
)
from tiletune.kernels.triton.space import TRITON_BACKEND

FAMILY = Family(
    "softmax",
    (
        Implementation(PORTABLE_BACKEND, SoftmaxDeclaration(), "tiletune.kernels.softmax.portable:SPEC"),
        Implementation(NATIVE_BACKEND, NativeSoftmaxDeclaration(), "tiletune.kernels.softmax.native:SPEC"),
        Implementation(TRITON_BACKEND, TritonSoftmaxDeclaration(), "tiletune.kernels.softmax.triton:SPEC"),
    ),
)
