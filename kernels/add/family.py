"""``add``'s family: its declaration and its implementations (:mod:`tiletune.kernels.family`).

- ``torch``: the tiled PyTorch pipeline (``portable``), the family's own kernel ``add``;
- ``native``: the C++ kernel on CPUs (``native``), tuned as ``native_add``;
- ``triton``: the Triton kernel (``triton``), tuned as ``triton_add``.

torch's own op (``vendor``) is a config of each of them (``has_vendor``).
"""

from __future__ import annotations

from tiletune.kernels.add.declaration import AddDeclaration, NativeAddDeclaration, TritonAddDeclaration
from tiletune.kernels.declaration import PORTABLE_BACKEND
from tiletune.kernels.family import Family, Implementation
from tiletune.kernels.native.space import NATIVE_BACKEND
from tiletune.kernels.triton.space import TRITON_BACKEND

FAMILY = Family(
    "add",
    (
        Implementation(PORTABLE_BACKEND, AddDeclaration(), "tiletune.kernels.add.portable:SPEC"),
        Implementation(NATIVE_BACKEND, NativeAddDeclaration(), "tiletune.kernels.add.native:SPEC"),
        Implementation(TRITON_BACKEND, TritonAddDeclaration(), "tiletune.kernels.add.triton:SPEC"),
    ),
)
