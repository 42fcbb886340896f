"""How the outcome of each trial is written into a search's Optuna study.

Contract: every trial a search finishes carries the user attribute ``KIND``
(``measured``, ``failed``, ``invalid``, ``duplicate`` or ``abandoned``) and,
except for a measurement, a ``REASON``. A measurement is told as its time;
an invalid or failed config is pruned with a violated constraint (TPE ranks it
below every result); a duplicate is answered from the recorded outcome (a
repeat of an outstanding config fails); an abandoned trial fails (it counts in
no budget). :func:`finished_trial` builds the same trial for a study rebuilt from a record
kept elsewhere (a resumed search).

Imports optuna only.
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, Trial, TrialState, create_trial

KIND = "tiletune_kind"
REASON = "tiletune_reason"
CONSTRAINT = "valid"


def tell_measured(study: optuna.Study, trial: Trial, time_ms: float) -> None:
    """A successful measurement: its time is the trial's value."""
    trial.set_user_attr(KIND, "measured")
    study.tell(trial, time_ms)


def tell_infeasible(study: optuna.Study, trial: Trial, kind: str, reason: str) -> None:
    """Invalid or failed: pruned with a violated constraint, which TPE ranks below every result."""
    trial.set_user_attr(KIND, kind)
    trial.set_user_attr(REASON, reason)
    trial.set_constraint(CONSTRAINT, 1.0)
    study.tell(trial, state=TrialState.PRUNED)


def tell_duplicate(study: optuna.Study, trial: Trial, recorded: float | str | None) -> None:
    """Answer a repeated proposal from the record; a repeat of an outstanding one fails."""
    trial.set_user_attr(KIND, "duplicate")
    if isinstance(recorded, float):
        study.tell(trial, recorded)
    elif isinstance(recorded, str):
        trial.set_user_attr(REASON, recorded)
        trial.set_constraint(CONSTRAINT, 1.0)
        study.tell(trial, state=TrialState.PRUNED)
    else:
        study.tell(trial, state=TrialState.FAIL)


def tell_abandoned(study: optuna.Study, trial: Trial, reason: str) -> None:
    """Given back unmeasured: failed, so it counts in no budget."""
    trial.set_user_attr(KIND, "abandoned")
    trial.set_user_attr(REASON, reason)
    study.tell(trial, state=TrialState.FAIL)


def finished_trial(
    kind: str,
    params: dict[str, Any],
    distributions: dict[str, BaseDistribution],
    time_ms: float | None = None,
    reason: str | None = None,
) -> FrozenTrial:
    """A finished trial as the ``tell_*`` functions leave it, for ``study.add_trial``.

    ``kind``: ``measured`` (``time_ms``), ``failed`` or ``invalid`` (pruned with a violated
    constraint), ``abandoned`` (failed).
    """
    user_attrs: dict[str, Any] = {KIND: kind}
    if kind == "measured":
        return create_trial(params=params, distributions=distributions, value=time_ms, user_attrs=user_attrs)
    user_attrs[REASON] = reason or kind
    if kind == "abandoned":
        return create_trial(
            state=TrialState.FAIL, params=params, distributions=distributions, user_attrs=user_attrs
        )
    return create_trial(
        state=TrialState.PRUNED,
        params=params,
        distributions=distributions,
        user_attrs=user_attrs,
        constraints={CONSTRAINT: 1.0},
    )
