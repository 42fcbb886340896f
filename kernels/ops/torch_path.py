"""Whether a call may run torch's own function directly: an answer of torch's op, nothing added.

An operator call whose answer is torch's op (a measured vendor answer, or the vendor choice of a
call with no measured answer, :func:`~tiletune.kernels.vendor.untuned_vendor_op`) runs torch's op
inside the operator. The operator's own machinery around it (``torch.library``'s dispatch, the
inputs' reading, the config's selection and checks) costs about 20 µs alone, but about 300 µs a
call right after a large matmul, where a model calls it: the BLAS call leaves the interpreter's
code and data out of the caches (``docs/benchmarks.md#untuned_choice``). So
``tiletune.nn.functional`` asks :func:`runs_torch` first and, when it answers yes, calls torch's
function itself, with torch's own autograd.

The answer is the operators' own rule, decided once per call layout (what the caller says its calls
are made from: sizes, strides, dtype, device, flags) and per what the source answers:

- deciding runs :func:`~tiletune.kernels.launcher.select_config` and
  :func:`~tiletune.kernels.ops.dispatch.vendor_to_run` on each key the call would look up, as the
  operators do: the forward's, and where autograd records the call the backward's keys too (built
  by the caller from the layout the backward would see); yes only when every one runs torch's op;
- afterwards a call that runs torch's function costs one lookup per key (the source's ``get``, so a
  miss is reported and a launch counted as the operator's call would be), and the decision stands
  while each key's answer says what it said (the same answer object, or the same config and
  ``match``); an answer that changed (a config arrived, a provisional answer expired) decides
  again. A call that runs the operator looks nothing up here (the operator does) for
  :data:`RECHECK_S` after its decision, then checks it again the same way. With no source (the
  kernels' rules) nothing is looked up and the decision stands;
- not while compiling (the graph keeps the operator: its source is read when it runs), nor for a
  call that cannot be decided (``calls()`` raises: bad inputs, for which the operator raises its
  own error, or a call the caller's operator does not take).

Each caller keeps to what its operator covers (dtypes, devices, autocast) before asking.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from tiletune.kernels.launcher import (
    CHECK_CACHE_SIZE,
    ConfigItems,
    ConfigSource,
    TunedConfig,
    answer_said,
    select_config,
)
from tiletune.kernels.ops.dispatch import implementation, vendor_to_run
from tiletune.kernels.ops.source import current_source

#: Seconds a decision to run the operator stands before its answers are looked up again.
RECHECK_S = 1.0


@dataclass(frozen=True)
class Call:
    """One operator call a decision looks at: its kernel, its tensors as the kernel takes them, its
    keyword dims, and the dtype it names (``None``: the tensors')."""

    kernel: str
    tensors: tuple[torch.Tensor, ...]
    dims: Mapping[str, int] = field(default_factory=dict)
    dtype: str | None = None


#: What an answer said, as a launch reads it (:func:`~tiletune.kernels.launcher.answer_said`).
_Said = tuple[ConfigItems, bool]


@dataclass(frozen=True)
class _Lookup:
    """One key's lookup made while deciding, and the answer it got."""

    kernel: str
    shape: dict[str, int]
    dtype: str
    answer: TunedConfig
    said: _Said


@dataclass(frozen=True)
class _Decision:
    lookups: tuple[_Lookup, ...]
    runs_torch: bool
    #: Until when (``time.monotonic``) a decision to run the operator stands unchecked.
    until: float


_decisions: dict[Hashable, _Decision] = {}


class _Recorder:
    """A source that passes each lookup on to ``source`` and keeps it."""

    def __init__(self, source: ConfigSource) -> None:
        self.source = source
        self.lookups: list[_Lookup] = []

    def get(self, kernel: str, shape: Mapping[str, int], /, *, dtype: str) -> TunedConfig:
        answer = self.source.get(kernel, shape, dtype=dtype)
        self.lookups.append(_Lookup(kernel, dict(shape), dtype, answer, answer_said(answer)))
        return answer


def _vendor_runs(call: Call, source: ConfigSource | None) -> bool:
    """Whether the operator would run torch's op for ``call`` under ``source``."""
    device_kind = call.tensors[0].device.type
    spec, backend = implementation(call.kernel, device_kind)
    selection = select_config(
        spec, *call.tensors, client=source, dtype=call.dtype, runs_vendor=True, **call.dims
    )
    return vendor_to_run(selection, device_kind, backend) is not None


def _decide(calls: Callable[[], Sequence[Call]], source: ConfigSource | None) -> _Decision:
    recorder = None if source is None else _Recorder(source)
    try:
        verdict = all(_vendor_runs(call, recorder) for call in calls())
    except Exception:  # inputs the operator refuses: it raises its own error
        verdict = False
    lookups = () if recorder is None else tuple(recorder.lookups)
    return _Decision(lookups, verdict, time.monotonic() + RECHECK_S)


def _stands(decision: _Decision, source: ConfigSource) -> bool:
    """Whether every key's answer still says what it said when ``decision`` was made."""
    for lookup in decision.lookups:
        try:
            answer = source.get(lookup.kernel, lookup.shape, dtype=lookup.dtype)
            if answer is not lookup.answer and answer_said(answer) != lookup.said:
                return False
        except Exception:  # a failing source or answer: the operator's path handles it
            return False
    return True


def runs_torch(layout: Hashable, calls: Callable[[], Sequence[Call]]) -> bool:
    """Whether a call may run torch's function itself (see the module): ``layout`` is everything
    ``calls`` builds the call's keys from (hashable); ``calls()`` gives the forward's call and, where
    autograd records it, its backward's calls."""
    if torch.compiler.is_compiling():
        return False
    source = current_source()
    key = (layout, None if source is None else id(source))  # another source decides afresh
    decision = _decisions.get(key)
    if decision is not None:
        if source is None or (not decision.runs_torch and time.monotonic() < decision.until):
            return decision.runs_torch
        if _stands(decision, source):
            if not decision.runs_torch:
                _decisions[key] = _Decision(decision.lookups, False, time.monotonic() + RECHECK_S)
            return decision.runs_torch
    decision = _decide(calls, source)
    if len(_decisions) >= CHECK_CACHE_SIZE:
        _decisions.clear()
    _decisions[key] = decision
    return decision.runs_torch
