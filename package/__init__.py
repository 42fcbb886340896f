"""tiletune: kernel tilings measured by a fleet of workers and looked up at every launch.

The package's front door. In a model::

    import tiletune

    tiletune.configure(url="http://tuner:8000", chip="cpu-x86_64-2c")  # or $TILETUNE_URL; else the rules
    tiletune.patch(model)  # its attention, RMSNorm and Linear run tiletune's operators

- :func:`configure`: where the operators' configs come from (a server, a pinned bundle, or the
  kernels' own rules: the default, with no network call); see :mod:`tiletune.kernels.ops.source`.
- :func:`patch`: swaps a model's layers for :mod:`tiletune.nn`'s, with no change to its code.

The subpackages: :mod:`tiletune.client` (launch-time lookups, no torch), :mod:`tiletune.kernels`
(declarations; the operators ``torch.ops.tiletune.*`` in :mod:`tiletune.kernels.ops`),
:mod:`tiletune.nn` (layers, functions, ``patch``), :mod:`tiletune.tuner` (workers),
:mod:`tiletune.service` (the server, installed without torch). Importing ``tiletune`` imports none
of them: ``configure`` and ``patch`` load :mod:`tiletune.nn` (and torch) on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tiletune.kernels.ops.source import configure
    from tiletune.nn.patch import patch

__all__ = ["configure", "patch"]


def __getattr__(name: str) -> Any:
    """``configure`` and ``patch``, from :mod:`tiletune.nn` on first use (PEP 562)."""
    if name in __all__:
        import tiletune.nn

        return getattr(tiletune.nn, name)
    raise AttributeError(f"module 'tiletune' has no attribute {name!r}")
