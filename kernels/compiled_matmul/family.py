"""``compiled_matmul``'s family: one implementation, builds of the C++ kernel with its tiles fixed
at build time (``spec``: the build recipe, loading and running a build)."""

from __future__ import annotations

from tiletune.kernels.compiled_matmul.declaration import COMPILED_BACKEND, CompiledMatmulDeclaration
from tiletune.kernels.family import Family, Implementation

FAMILY = Family(
    "compiled_matmul",
    (
        Implementation(
            COMPILED_BACKEND, CompiledMatmulDeclaration(), "tiletune.kernels.compiled_matmul.spec:SPEC"
        ),
    ),
)
