"""``softmax``'s family (:mod:`tiletune.kernels.family`): the tiled PyTorch pipeline (``portable``), the
native C++ (``native``, tuned as ``native_softmax``) and the Triton kernel (``triton``, tuned as
``triton_softmax``); torch's own op (``vendor``) is a config of each."""

from __future__ import annotations

from tiletune.kernels.family import tiled_family
from tiletune.kernels.softmax.declaration import (
    NativeSoftmaxDeclaration,
    SoftmaxDeclaration,
    TritonSoftmaxDeclaration,
)

FAMILY = tiled_family(
    "tiletune.kernels.softmax", SoftmaxDeclaration(), NativeSoftmaxDeclaration(), TritonSoftmaxDeclaration()
)
