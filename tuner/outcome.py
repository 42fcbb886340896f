"""How the outcome of each trial is written into a search's Optuna study, and read back.

Contract: every trial a search finishes carries the user attribute ``KIND``
(``measured``, ``failed``, ``invalid``, ``duplicate`` or ``abandoned``) and,
except for a measurement, a ``REASON``. A measurement is told as its time;
an invalid or failed config is pruned with a violated constraint (TPE ranks it
below every result); a duplicate is answered from the recorded outcome (a
repeat of an outstanding config fails); an abandoned trial fails (it counts in
no budget). :func:`kind_of` and :func:`reason_of` read them back, so a study
alone is enough to resume a search.

Imports optuna only.
"""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

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


def kind_of(frozen: FrozenTrial) -> str | None:
    """The kind a finished trial was told as (``None`` for a trial of another writer)."""
    kind = frozen.user_attrs.get(KIND)
    return str(kind) if kind is not None else None


def reason_of(frozen: FrozenTrial, default: str) -> str:
    """Why a trial was not a measurement, or ``default`` when it says nothing."""
    return str(frozen.user_attrs.get(REASON, default))
