"""``add``'s family (:mod:`tiletune.kernels.family`): the tiled PyTorch pipeline (``portable``), the
native C++ (``native``, tuned as ``native_add``) and the Triton kernel (``triton``, tuned as
``triton_add``); torch's own op (``vendor``) is a config of each."""

from __future__ import annotations

from tiletune.kernels.add.declaration import AddDeclaration, NativeAddDeclaration, TritonAddDeclaration
from tiletune.kernels.family import tiled_family

FAMILY = tiled_family(
    "tiletune.kernels.add", AddDeclaration(), NativeAddDeclaration(), TritonAddDeclaration()
)
