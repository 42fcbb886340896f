"""``matmul``'s family: its declaration and its implementations (:mod:`tiletune.kernels.family`).

- ``torch``: the tiled PyTorch pipeline (``portable``), the family's own kernel ``matmul``;
- ``native``: the C++ kernel on CPUs (``native``), tuned as ``native_matmul``;
- ``triton``: the Triton kernel (``triton``), tuned as ``triton_matmul``.

torch's own op (``vendor``) is a config of each of them (``has_vendor``).
"""

from __future__ import annotations

from tiletune.kernels.declaration import PORTABLE_BACKEND
from tiletune.kernels.family import Family, Implementation
from tiletune.kernels.matmul.declaration import (
    MatmulDeclaration,
    NativeMatmulDeclaration,
    TritonMatmulDeclaration,
)
from tiletune.kernels.native.space import NATIVE_BACKEND
from tiletune.kernels.triton.space import TRITON_BACKEND

FAMILY = Family(
    "matmul",
    (
        Implementation(PORTABLE_BACKEND, MatmulDeclaration(), "tiletune.kernels.matmul.portable:SPEC"),
        Implementation(NATIVE_BACKEND, NativeMatmulDeclaration(), "tiletune.kernels.matmul.native:SPEC"),
        Implementation(TRITON_BACKEND, TritonMatmulDeclaration(), "tiletune.kernels.matmul.triton:SPEC"),
    ),
)
