"""
`jupyter_trainmate.suggest()`: a hyperparameter's value, chosen by the sweep's current trial.

Inside `%%train --sweep N` the driver sets the trial (`current`) before each run of the cell and
`suggest` asks it (Optuna's `suggest_float`, `suggest_int`, `suggest_categorical`). Outside a
sweep it returns `default=`, else the middle of the range (the geometric middle with `log=True`)
or the first choice, so the same cell runs unchanged without `--sweep`.

`Param` is one dimension of a search space, shared with `--space` (`space.py`) and the grid
sampler, which needs the whole space before the first trial (`cell_params` reads the cell's
`suggest(...)` calls with literal arguments).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..errors import TrainmateError

if TYPE_CHECKING:
    import optuna

Choice = None | bool | int | float | str

_current: optuna.Trial | None = None  # the trial of the run in progress (set by the driver)


def current() -> optuna.Trial | None:
    return _current


def set_current(trial: optuna.Trial | None) -> None:
    global _current
    _current = trial


def reset() -> None:
    """Forget the current trial (tests: each starts outside a sweep)."""
    set_current(None)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class Param:
    """One hyperparameter: a number range (`int`/`float`, maybe `log` or with a `step`) or a
    list of choices."""

    name: str
    kind: Literal["int", "float", "choice"]
    low: float = 0
    high: float = 0
    log: bool = False
    step: float | None = None
    choices: tuple[Choice, ...] = ()

    @classmethod
    def of(
        cls,
        name: object,
        low: object,
        high: object = None,
        *,
        log: bool = False,
        step: object = None,
    ) -> Param:
        """Checked arguments of `suggest(...)` (a one-line `TrainmateError` otherwise)."""
        what = f"suggest({name!r}, {low!r}" + (f", {high!r})" if high is not None else ")")
        if not isinstance(name, str) or not name:
            raise TrainmateError(f"{what}: the name must be a non-empty string")
        if isinstance(low, list | tuple) and high is None:
            if not low:
                raise TrainmateError(f"{what}: give at least one choice")
            bad = [c for c in low if not (c is None or isinstance(c, bool | int | float | str))]
            if bad:
                raise TrainmateError(
                    f"{what}: choices must be numbers, strings, booleans or None, not {bad[0]!r}"
                )
            if log or step is not None:
                raise TrainmateError(f"{what}: log= and step= are for number ranges")
            return cls(name, "choice", choices=tuple(low))
        if high is None:
            raise TrainmateError(f"{what}: give LOW and HIGH, or a list of choices")
        if not (_is_number(low) and _is_number(high)):
            raise TrainmateError(f"{what}: LOW and HIGH must be numbers")
        assert isinstance(low, int | float)
        assert isinstance(high, int | float)
        if not (math.isfinite(low) and math.isfinite(high)) or not low < high:
            raise TrainmateError(f"{what}: need finite LOW < HIGH")
        if log and low <= 0:
            raise TrainmateError(f"{what}: log=True needs LOW > 0")
        if step is not None:
            if not _is_number(step) or not step > 0:  # type: ignore[operator]
                raise TrainmateError(f"{what}: step={step!r} must be a number above 0")
            if log:
                raise TrainmateError(f"{what}: log=True and step= do not go together")
        integer = isinstance(low, int) and isinstance(high, int)
        integer = integer and (step is None or isinstance(step, int))
        return cls(
            name,
            "int" if integer else "float",
            low,
            high,
            log,
            float(step) if step is not None else None,  # type: ignore[arg-type]
        )

    def default(self) -> Any:
        """The value outside a sweep: the first choice, else the (geometric) middle of the range,
        on the step grid."""
        if self.kind == "choice":
            return self.choices[0]
        middle = math.sqrt(self.low * self.high) if self.log else (self.low + self.high) / 2
        if self.step is not None:
            middle = self.low + round((middle - self.low) / self.step) * self.step
            middle = min(middle, self.high)
        return round(middle) if self.kind == "int" else middle

    def suggest(self, trial: optuna.Trial) -> Any:
        if self.kind == "choice":
            return trial.suggest_categorical(self.name, self.choices)
        if self.kind == "int":
            step = int(self.step) if self.step is not None else 1
            return trial.suggest_int(
                self.name, int(self.low), int(self.high), step=step, log=self.log
            )
        return trial.suggest_float(self.name, self.low, self.high, step=self.step, log=self.log)

    def grid(self) -> tuple[Choice, ...]:
        """Every value, for the grid sampler: choices, or a range on its step."""
        if self.kind == "choice":
            return self.choices
        if self.kind == "int" and self.step is None and not self.log:
            return tuple(range(int(self.low), int(self.high) + 1))
        if self.step is None:
            raise TrainmateError(
                f"--sampler grid: {self.name!r} is a continuous range; give it step= or choices"
            )
        count = math.floor((self.high - self.low) / self.step + 1e-9) + 1
        values = [self.low + i * self.step for i in range(count)]
        return tuple(int(v) if self.kind == "int" else v for v in values)


def suggest(
    name: str,
    low: float | Sequence[Choice],
    high: float | None = None,
    *,
    log: bool = False,
    step: float | None = None,
    default: Any = None,
) -> Any:
    """A hyperparameter for `%%train --sweep N`: `lr = suggest("lr", 1e-4, 1e-1, log=True)`,
    `width = suggest("width", [128, 256, 512])`, `layers = suggest("layers", 1, 4)` (an int when
    both bounds are ints; `step=` for a grid).

    In a sweep the trial chooses. Outside one it returns `default` if given, else the middle of the
    range (the geometric middle with `log=True`) or the first choice: the cell runs unchanged
    without `--sweep`. Bad arguments are a one-line error.
    """
    param = Param.of(name, low, high, log=log, step=step)
    trial = _current
    if trial is None:
        return param.default() if default is None else default
    return param.suggest(trial)


def cell_params(source: str) -> list[Param]:
    """The `suggest(...)` calls of a cell whose arguments are literals, in order (for the grid
    sampler, which needs the space before the first trial)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found: dict[str, Param] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if called != "suggest":
            continue
        try:
            args = [ast.literal_eval(a) for a in node.args]
            kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
        except ValueError:
            raise TrainmateError(
                f"--sampler grid: the suggest() call on line {node.lineno} needs literal "
                "arguments (the grid is made before the first trial)"
            ) from None
        kwargs.pop("default", None)
        param = Param.of(*args, **kwargs)
        found[param.name] = param
    return list(found.values())
