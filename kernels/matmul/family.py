"""``matmul``'s family (:mod:`tiletune.kernels.family`): the tiled PyTorch pipeline (``portable``), the
native C++ (``native``, tuned as ``native_matmul``) and the Triton kernel (``triton``, tuned as
``triton_matmul``); torch's own op (``vendor``) is a config of each."""

from __future__ import annotations

from tiletune.kernels.family import tiled_family
from tiletune.kernels.matmul.declaration import (
    MatmulDeclaration,
    NativeMatmulDeclaration,
    TritonMatmulDeclaration,
)

FAMILY = tiled_family(
    "tiletune.kernels.matmul", MatmulDeclaration(), NativeMatmulDeclaration(), TritonMatmulDeclaration()
)
