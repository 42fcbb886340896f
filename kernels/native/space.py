"""What the native CPU kernels' declarations share: the ``block_dim`` knob and its constraint (torch-free).

A native kernel (``native_add``, ``native_softmax``, ``native_rms_norm``, ``native_matmul``,
``native_fused_attention``) declares its portable kernel's dims, tile knobs, working set, default
rule and counts, and adds one knob:

- ``block_dim``: the cores the tiles are spread over (Ascend C's block dim), 1, 2, 4, … the chip's
  cores (``DeviceLimits.cores``, which workers report). Where the cores are not known (a worker
  that does not report them) it is declared 1 alone: a space never depends on the machine that
  plans it. More cores than tiles is invalid (idle cores).

The default config is the portable rule's plus ``block_dim = min(cores, tiles)``.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from tiletune.client.space import DeviceLimits, Knob, pow2_up_to, snap_down
from tiletune.kernels.declaration import PORTABLE_BACKEND, Config, KernelDeclaration, Shape

#: The implementation's name: the C++ kernels of ``kernels/native/csrc``.
NATIVE_BACKEND = "native"
#: What a portable kernel with a native twin declares: the tiled PyTorch pipeline and the C++.
PORTABLE_AND_NATIVE = (PORTABLE_BACKEND, NATIVE_BACKEND)

#: Declared ``up_to`` the chip's cores: on a chip whose limits report them, 1, 2, 4, … its cores;
#: where they are not known, 1 (one core: the safe space, whatever machine plans it).
BLOCK_DIM = Knob(
    "block_dim",
    (1,),
    "cores the tiles are spread over (Ascend C's block dim); each core runs its tiles' pipeline",
    up_to="cores",
)


def in_preference(backends: Sequence[str], device_kind: str, first: str | None = None) -> tuple[str, ...]:
    """``backends`` in the order a run on ``device_kind`` prefers them when it names none: ``first``
    (default: ``native`` on a CPU, nothing elsewhere) moved to the front where it is among them,
    the others in their order. One rule for a local run and for the server's lease."""
    if first is None and device_kind == "cpu":
        first = NATIVE_BACKEND
    if first is None or first not in backends:
        return tuple(backends)
    return (first, *(backend for backend in backends if backend != first))


def with_block_dim(knobs: Sequence[Knob]) -> tuple[Knob, ...]:
    """A portable kernel's knobs with :data:`BLOCK_DIM` inserted before ``buffer_num``."""
    names = [k.name for k in knobs]
    at = names.index("buffer_num") if "buffer_num" in names else len(knobs)
    return (*knobs[:at], BLOCK_DIM, *knobs[at:])


def block_dim_for(tiles: int, cores: int) -> int:
    """``block_dim`` for a config of ``tiles`` tiles on ``cores`` cores: the most of the cores'
    values (:func:`pow2_up_to`) the tiles use."""
    return snap_down(min(cores, tiles), pow2_up_to(cores))


class NativeDeclaration(KernelDeclaration):
    """Base of the native kernels' declarations: put it first among the bases, before the
    portable kernel's declaration.

    Subclasses give ``portable`` (the portable declaration class they implement), ``knobs``
    (its knobs :func:`with_block_dim`) and ``tile_count``.
    """

    portable: ClassVar[type[KernelDeclaration]]
    implementations: tuple[str, ...] = (NATIVE_BACKEND,)

    @abstractmethod
    def tile_count(self, config: Config, shape: Shape) -> int:
        """How many tiles the work is cut into (what ``block_dim`` cores share)."""

    def invalid_reason(self, config: Config, shape: Shape, dtype: str, limits: DeviceLimits) -> str | None:
        """More cores than tiles is invalid (they would idle); then the portable rules."""
        block_dim, tiles = config.get("block_dim", 1), self.tile_count(config, shape)
        if block_dim > tiles:
            return f"block_dim={block_dim} exceeds the {tiles} tile(s) of this config: cores would idle"
        return super().invalid_reason(config, shape, dtype, limits)

    def default_config(self, shape: Shape, dtype: str, limits: DeviceLimits) -> Config:
        """The portable rule's config, its tiles spread over ``min(cores, tiles)`` of the chip's
        cores (1 where they are not known)."""
        config = self.portable.default_config(self, shape, dtype, limits)
        return self.with_cores(config, shape, limits.cores or 1)

    def with_cores(self, config: Config, shape: Shape, cores: int) -> Config:
        """``config`` with ``block_dim`` for a chip of ``cores`` cores (:func:`block_dim_for`)."""
        merged = {**config, "block_dim": block_dim_for(self.tile_count(config, shape), cores)}
        return {knob.name: merged[knob.name] for knob in self.knobs}
