"""``softmax_backward``'s family: its declaration and its implementations (:mod:`tiletune.kernels.family`).

- ``torch``: the tiled PyTorch pipeline (``portable``), the family's own kernel ``softmax_backward``;
- ``native``: the C++ kernel on CPUs (``native``), tuned as ``native_softmax_backward``;
- ``triton``: the Triton kernel (``triton``), tuned as ``triton_softmax_backward``.

torch's own op (``vendor``) is a config of each of them (``has_vendor``).
"""

from __future__ import annotations

from tiletune.kernels.declaration import PORTABLE_BACKEND
from tiletune.kernels.family import Family, Implementation
from tiletune.kernels.native.space import NATIVE_BACKEND
from tiletune.kernels.softmax_backward.declaration import (
    NativeSoftmaxBackwardDeclaration,
    SoftmaxBackwardDeclaration,
    TritonSoftmaxBackwardDeclaration,
)
from tiletune.kernels.triton.space import TRITON_BACKEND

FAMILY = Family(
    "softmax_backward",
    (
        Implementation(
            PORTABLE_BACKEND, SoftmaxBackwardDeclaration(), "tiletune.kernels.softmax_backward.portable:SPEC"
        ),
        Implementation(
            NATIVE_BACKEND,
            NativeSoftmaxBackwardDeclaration(),
            "tiletune.kernels.softmax_backward.native:SPEC",
        ),
        Implementation(
            TRITON_BACKEND,
            TritonSoftmaxBackwardDeclaration(),
            "tiletune.kernels.softmax_backward.triton:SPEC",
        ),
    ),
)
