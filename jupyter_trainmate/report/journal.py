"""Sweep trials as Optuna saw them: value, state and the study's direction, from
`runs/optuna.journal` (where `%%train --sweep` keeps its studies), when Optuna is installed.

A trial's run record names its study, trial number and parameters, but not its value (the best
reported value of the sweep's `--monitor`, known only to the study), so the report reads it here.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

JOURNAL = "optuna.journal"


@dataclass(frozen=True)
class JournalStudy:
    direction: str  # "min" or "max"
    values: dict[int, float | None]  # trial number -> value (None: pruned, failed, running)
    states: dict[int, str]  # trial number -> "complete", "pruned", "fail", "running", ...


def read_journal(
    runs_dir: Path, names: Iterable[str], warn: Callable[[str], None]
) -> dict[str, JournalStudy]:
    """The studies `names` found in `runs_dir/optuna.journal` (none without the file or Optuna)."""
    path = runs_dir / JOURNAL
    wanted = sorted(set(names))
    if not wanted or not path.is_file() or importlib.util.find_spec("optuna") is None:
        return {}
    found: dict[str, JournalStudy] = {}
    try:
        import optuna
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend
        from optuna.study import StudyDirection

        storage = JournalStorage(JournalFileBackend(str(path)))
        known = {s.study_name for s in optuna.get_all_study_summaries(storage)}
        for name in wanted:
            if name not in known:
                continue
            study = optuna.load_study(study_name=name, storage=storage)
            trials = study.get_trials(deepcopy=False)
            found[name] = JournalStudy(
                direction="max" if study.direction == StudyDirection.MAXIMIZE else "min",
                values={t.number: t.value for t in trials},
                states={t.number: t.state.name.lower() for t in trials},
            )
    except Exception as exc:  # a torn journal, a multi-objective study: the records serve
        warn(f"{path}: sweep values not read ({type(exc).__name__}: {exc})")
        return {}
    return found
