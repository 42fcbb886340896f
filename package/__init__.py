"""tiletune: kernel tilings measured by a fleet of workers and looked up at every launch.

The package's front door. In a model::

    import tiletune

    tiletune.configure(url="http://tuner:8000", chip="cpu-x86_64-2c")  # or $TILETUNE_URL; else the rules
    tiletune.patch(model)  # its attention, RMSNorm and Linear run tiletune's operators
    tiletune.tune(model, tokens)  # optional: tune the keys its steps meet, here, into a file

- :func:`configure`: where the operators' configs come from (a server, a pinned bundle, or the
  kernels' own rules: the default, with no network call); see :mod:`tiletune.kernels.ops.source`.
- :func:`patch`: swaps a model's layers for :mod:`tiletune.nn`'s, with no change to its code.
- :func:`tune`: tunes the keys one inference and one training step meet, on this machine with no
  server, into a bundle file the process then pins to (``TILETUNE_TUNE=1`` does it for a whole run);
  see :mod:`tiletune.tuner.measure.model_tuning`.

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
    from tiletune.tuner.measure.model_tuning import tune

__all__ = ["configure", "patch", "tune"]


def __getattr__(name: str) -> Any:
    """``configure`` and ``patch`` from :mod:`tiletune.nn`, ``tune`` from
    :mod:`tiletune.tuner.measure.model_tuning`, on first use (PEP 562)."""
    if name == "tune":
        from tiletune.tuner.measure.model_tuning import tune

        return tune
    if name in __all__:
        import tiletune.nn

        return getattr(tiletune.nn, name)
    raise AttributeError(f"module 'tiletune' has no attribute {name!r}")
