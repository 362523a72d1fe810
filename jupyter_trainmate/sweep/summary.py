"""The summary of a sweep (`jupyter_trainmate.last_sweep()`): frozen records made from the study."""

from __future__ import annotations

import datetime
import math
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import optuna

TrialStateName = Literal["running", "complete", "pruned", "failed", "waiting"]


@dataclass(frozen=True)
class SweepTrial:
    """One trial: its number, parameters, value (None when it has none), state and seconds."""

    number: int
    params: dict[str, Any]
    value: float | None
    state: TrialStateName
    duration: float | None  # seconds
    reason: str | None = None  # why it failed or was pruned
    checkpoint: str | None = None  # its last checkpoint, with --checkpoint


@dataclass(frozen=True)
class SweepSummary:
    """What a `%%train --sweep` did: the best trial and every trial of the study, in order."""

    study: str
    monitor: str
    direction: Literal["min", "max"]
    trials: tuple[SweepTrial, ...]
    best_trial: SweepTrial | None
    importances: dict[str, float] = field(default_factory=dict)
    stopped: str | None = None  # why the search ended before its trials (failures, Ctrl-C, time)

    @property
    def best_params(self) -> dict[str, Any]:
        return dict(self.best_trial.params) if self.best_trial is not None else {}

    @property
    def best_value(self) -> float | None:
        return self.best_trial.value if self.best_trial is not None else None

    def count(self, state: TrialStateName) -> int:
        return sum(t.state == state for t in self.trials)

    def line(self) -> str:
        counts = ", ".join(
            f"{self.count(s)} {s}" for s in ("complete", "pruned", "failed") if self.count(s)
        )
        best = (
            f"best {self.monitor}={self.best_value:.4g} (trial {self.best_trial.number}: "
            f"{_params_text(self.best_params)})"
            if self.best_trial is not None and self.best_value is not None
            else "no complete trial"
        )
        stopped = f"; {self.stopped}" if self.stopped else ""
        return (
            f"trainmate sweep {self.study}: {len(self.trials)} trial(s) ({counts or 'none'}); "
            f"{best}{stopped}"
        )

    def table(self) -> str:
        """The trials as a text table (the text view, `text/plain` of the saved output)."""
        names = sorted({k for t in self.trials for k in t.params})
        header = ["trial", *names, self.monitor, "state", "time"]
        rows = [header]
        for t in self.trials:
            mark = (
                " *" if self.best_trial is not None and t.number == self.best_trial.number else ""
            )
            rows.append(
                [
                    f"{t.number}{mark}",
                    *(_value_text(t.params.get(n, "")) for n in names),
                    _value_text(t.value) if t.value is not None else "-",
                    t.state + (f" ({t.reason})" if t.reason and t.state == "failed" else ""),
                    f"{t.duration:.1f}s" if t.duration is not None else "-",
                ]
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
        ]
        if self.importances:
            parts = ", ".join(f"{k} {v:.2f}" for k, v in self.importances.items())
            lines.append(f"importances: {parts}")
        return "\n".join([self.line(), *lines])


def _value_text(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _params_text(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_value_text(v)}" for k, v in params.items()) or "no parameters"


def trial_record(trial: optuna.trial.FrozenTrial) -> SweepTrial:
    from optuna.trial import TrialState

    states: dict[TrialState, TrialStateName] = {
        TrialState.RUNNING: "running",
        TrialState.COMPLETE: "complete",
        TrialState.PRUNED: "pruned",
        TrialState.FAIL: "failed",
        TrialState.WAITING: "waiting",
    }
    state = states[trial.state]
    value = trial.value if trial.state == TrialState.COMPLETE else None
    if trial.state == TrialState.PRUNED and trial.intermediate_values:
        value = trial.intermediate_values[max(trial.intermediate_values)]
    if value is not None and not math.isfinite(value):
        value = None if trial.state != TrialState.COMPLETE else value
    start, end = trial.datetime_start, trial.datetime_complete
    duration = None
    if start is not None:
        end = end or datetime.datetime.now()
        duration = (end - start).total_seconds()
    attrs = trial.user_attrs
    return SweepTrial(
        number=trial.number,
        params=dict(trial.params),
        value=value,
        state=state,
        duration=duration,
        reason=attrs.get("trainmate_reason"),
        checkpoint=attrs.get("trainmate_checkpoint"),
    )


def summarise(
    study: optuna.Study,
    monitor: str,
    *,
    importances: dict[str, float] | None = None,
    stopped: str | None = None,
) -> SweepSummary:
    from optuna.study import StudyDirection

    trials = tuple(trial_record(t) for t in study.get_trials(deepcopy=False))
    direction: Literal["min", "max"] = (
        "max" if study.direction == StudyDirection.MAXIMIZE else "min"
    )
    complete = [t for t in trials if t.state == "complete" and t.value is not None]
    best = None
    if complete:
        pick = max if direction == "max" else min
        best = pick(
            complete,
            key=lambda t: (t.value, -t.number) if direction == "max" else (t.value, t.number),
        )
    return SweepSummary(
        study=study.study_name,
        monitor=monitor,
        direction=direction,
        trials=trials,
        best_trial=best,
        importances=dict(importances or {}),
        stopped=stopped,
    )


def importances(study: optuna.Study) -> dict[str, float]:
    """Optuna's parameter importances; empty with fewer than 2 complete trials or one value."""
    import optuna
    from optuna.trial import TrialState

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(complete) < 2 or not any(t.params for t in complete):
        return {}
    try:
        with warnings.catch_warnings():  # "importances will be equal" on a few trials
            warnings.simplefilter("ignore")
            found = optuna.importance.get_param_importances(study)
    except (RuntimeError, ValueError, ZeroDivisionError):  # a space that did not vary
        return {}
    return {k: float(v) for k, v in found.items()}


_last: SweepSummary | None = None


def last_sweep() -> SweepSummary | None:
    """The summary of the most recent `%%train --sweep` in this process, or None before the first."""
    return _last


def remember_last_sweep(summary: SweepSummary) -> None:
    global _last
    _last = summary


def reset() -> None:
    """Forget the last sweep (tests: each starts with none)."""
    global _last
    _last = None
