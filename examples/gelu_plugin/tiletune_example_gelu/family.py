"""The plugin's family record: what tiletune discovers (entry point ``tiletune.families``).

One implementation, the tiled PyTorch one (``torch``): its declaration (``space``, torch-free: what
a server reads) and where its spec lives (``spec``: what workers and local commands run, imported
on first use). A family with more implementations (a Triton kernel, an Ascend C op) lists each;
torch's own op would be a config, declared by ``has_vendor`` and given by the spec's ``vendor``.
"""

from __future__ import annotations

from tiletune.kernels.declaration import PORTABLE_BACKEND
from tiletune.kernels.family import Family, Implementation
from tiletune_example_gelu.space import GELU

FAMILY = Family("gelu", (Implementation(PORTABLE_BACKEND, GELU, "tiletune_example_gelu.spec:SPEC"),))
