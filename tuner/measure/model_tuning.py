"""``tiletune.tune(model, *example_inputs)``: tune every key a model's steps meet, from Python.

The one switch (:mod:`tiletune.tuner.measure.tuning_source`) as a call: one inference step
(``no_grad``) and one training step (forward, then the gradients of the sum of its floating-point
outputs with respect to the parameters, computed with ``torch.autograd.grad``: no ``.grad`` is
written, no optimizer runs, the weights do not change) run under a
:class:`~tiletune.tuner.measure.tuning_source.TuningSource`, so each key they meet is tuned when
first met (keys the file already holds are not). Then the process is pinned to the file
(``configure(pin=...)``): the model runs on the tuned configs, and nothing is tuned again.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from torch.utils._pytree import tree_leaves

from tiletune.kernels.ops.source import configure, using_source
from tiletune.tuner.measure.tuning_source import KeyTuned, TuningSettings, TuningSource


def tune(
    model: torch.nn.Module,
    *example_inputs: object,
    trials: int | None = None,
    time_s: float | None = None,
    path: str | Path | None = None,
) -> list[KeyTuned]:
    """Tune the keys one inference and one training step of ``model`` on ``example_inputs`` meet
    (see the module); what was tuned, in order. ``trials``, ``time_s`` and ``path`` default to
    ``$TILETUNE_TUNE_TRIALS``, ``$TILETUNE_TUNE_TIME_S`` and ``$TILETUNE_TUNE_FILE``.

    Raises ``ValueError`` when the steps met no tiletune operator (the model is not patched:
    ``tiletune.patch(model)`` first) and :class:`~tiletune.tuner.measure.tuning_source.TuningSettingsError`
    for a bad setting.
    """
    settings = TuningSettings.from_env()
    settings = replace(
        settings,
        path=Path(path) if path is not None else settings.path,
        trials=trials if trials is not None else settings.trials,
        time_s=time_s if time_s is not None else settings.time_s,
    )
    source = tune_steps(model, example_inputs, settings)
    if not source.met:
        raise ValueError("the model's steps ran no tiletune operator: patch it first (tiletune.patch(model))")
    if settings.path.exists():  # no key tuned and no file: the process's source stays as it was
        configure(pin=str(settings.path), tune=False)
    return source.tuned


def tune_steps(
    model: torch.nn.Module, example_inputs: tuple[object, ...], settings: TuningSettings
) -> TuningSource:
    """:func:`run_steps` under a :class:`TuningSource` of ``settings``; the source, closed, with the
    keys it met and what it tuned (a second call over the same file tunes none it holds)."""
    source = TuningSource(settings)
    try:
        with using_source(source):
            run_steps(model, example_inputs)
    finally:
        source.close()
    return source


def run_steps(model: torch.nn.Module, example_inputs: tuple[object, ...]) -> None:
    """The steps whose keys :func:`tune` tunes: a ``no_grad`` forward, then a forward and the
    gradients of its floating-point outputs' sum for the parameters that take them, written nowhere
    (no parameter needs a gradient: the forward alone)."""
    with torch.no_grad():
        model(*example_inputs)
    output = model(*example_inputs)
    parameters = [p for p in model.parameters() if p.requires_grad]
    leaves = [
        leaf
        for leaf in tree_leaves(output)
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.requires_grad
    ]
    if parameters and leaves:
        loss = torch.stack([leaf.float().sum() for leaf in leaves]).sum()
        torch.autograd.grad(loss, parameters, allow_unused=True)
