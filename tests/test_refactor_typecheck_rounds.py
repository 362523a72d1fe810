"""How many mypy rounds typecheck takes, and what they leave: an error that no parameter's
annotation causes decorates its function in the round that shows it (the next round only
confirms), and a package whose only errors no edit can change stops after the round that shows
them. Rounds are counted, never timed."""

from __future__ import annotations

import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from jupyter_trainmate.refactor import typecheck


@pytest.fixture
def rounds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of errors of each mypy round of the checks the test runs."""
    seen: list[int] = []
    run = typecheck.run_mypy

    def counted(
        folder: Path, package: str, files: typecheck.Files | None = None, collect: object = None
    ) -> object:
        errors = run(folder, package, files, collect)  # type: ignore[arg-type]
        seen.append(len(errors) if isinstance(errors, list) else -1)
        return errors

    monkeypatch.setattr(typecheck, "run_mypy", counted)
    return seen


def _package(code: str) -> dict[str, str]:
    return {"pkg/__init__.py": "", "pkg/a.py": textwrap.dedent(code).lstrip()}


MEMORY = """
from collections import deque


class Memory:
    def __init__(self, capacity: int, name: str) -> None:
        self.items = {"recent": deque(maxlen=capacity)}
        self.name = name
"""


def test_a_missing_variable_annotation_decorates_at_once_and_keeps_the_parameters(
    rounds: list[int],
) -> None:
    # (a dict of deques: mypy gives no hint, so `declare` has no annotation to write)
    # `capacity` is named on the line of "Need type annotation for items", but its type is not
    # the cause: dropping it leaves `name: str` and `-> None`, so mypy still checks the function
    added = {".a.Memory.__init__": SimpleNamespace(params={"capacity": "int"}, returns=None)}
    checked = typecheck.check(_package(MEMORY), "pkg", added)
    assert checked.result == "clean"
    assert rounds == [1, 0]  # decorated in the first round, the second confirms
    assert checked.removed == ()
    assert [where for where, _ in checked.no_type_check] == ["a.Memory.__init__"]
    assert (
        "    @no_type_check\n    def __init__(self, capacity: int, name: str)"
        in checked.files["pkg/a.py"]
    )


def test_a_variable_mypy_names_the_type_of_is_declared_in_the_same_round(
    rounds: list[int],
) -> None:
    # a deque alone: mypy's "Need type annotation" has no hint, but the value's class says it;
    # the variable gets it (`declare`) in the round that shows the error, nothing is decorated
    # or removed, and the next round confirms
    code = MEMORY.replace('{"recent": deque(maxlen=capacity)}', "deque(maxlen=capacity)")
    added = {".a.Memory.__init__": SimpleNamespace(params={"capacity": "int"}, returns=None)}
    checked = typecheck.check(_package(code), "pkg", added)
    assert checked.result == "clean"
    assert rounds == [1, 0]
    assert checked.no_type_check == ()
    assert checked.removed == ()
    assert checked.declared == ("a.Memory.__init__: items: deque[Any]",)
    assert "        self.items: deque[Any] = deque(maxlen=capacity)\n" in checked.files["pkg/a.py"]


def test_a_drop_that_leaves_the_function_unannotated_still_comes_first(
    rounds: list[int],
) -> None:
    # here `capacity` is the function's only annotation: without it mypy does not check the
    # function at all, so the annotation goes and no decorator is needed
    code = """
    from collections import deque


    def memory(capacity: int):
        items = {"recent": deque(maxlen=capacity)}
        return items
    """
    added = {".a.memory": SimpleNamespace(params={"capacity": "int"}, returns=None)}
    checked = typecheck.check(_package(code), "pkg", added)
    assert checked.result == "clean"
    assert rounds == [1, 0]
    assert checked.removed == ("a.memory(capacity)",)
    assert checked.no_type_check == ()
    assert "def memory(capacity):" in checked.files["pkg/a.py"]


def test_errors_no_edit_can_change_stop_after_the_round_that_shows_them(
    rounds: list[int],
) -> None:
    # a module-level redefinition is in no function: nothing to drop or decorate
    code = """
    import os

    os = 1


    def double(x: int) -> int:
        return x * 2
    """
    added = {".a.double": SimpleNamespace(params={"x": "int"}, returns="int")}
    checked = typecheck.check(_package(code), "pkg", added)
    assert rounds == [1]
    assert checked.result == "1 errors left"
    assert checked.removed == ()
    assert checked.no_type_check == ()


def test_an_attribute_read_from_a_parameter_drops_that_parameter_s_annotation(
    rounds: list[int],
) -> None:
    # "Cannot determine type of total" on `box.total`: mypy looks `total` up in `box`'s
    # annotated class, whose defining method it does not check; without the annotation `box`
    # is Any and the error ends, so the annotations named on the line go as before (no
    # decorator) and the function keeps being checked
    code = """
    from typing import no_type_check


    class Box:
        @no_type_check
        def __init__(self, n):
            self.total = n


    def read(box: Box, scale: int) -> int:
        return box.total * scale
    """
    added = {".a.read": SimpleNamespace(params={"box": "Box", "scale": "int"}, returns=None)}
    checked = typecheck.check(_package(code), "pkg", added)
    assert checked.result == "clean"
    assert rounds == [1, 0]
    assert checked.removed == ("a.read(box)", "a.read(scale)")
    assert checked.no_type_check == ()
    assert "def read(box, scale) -> int:" in checked.files["pkg/a.py"]


def test_a_method_that_sets_attributes_loses_its_annotations_not_its_class_s_checks(
    rounds: list[int],
) -> None:
    # RL-Adventure's `ReplayBuffer` (and eight more notebooks of the corpora): decorating
    # `__init__` would leave `self.buffer` without a type, and every method reading it would
    # fail mypy one round later ("Cannot determine type") and be decorated in turn. All of
    # `__init__`'s annotations are ours: without them mypy does not check it, `buffer` is Any,
    # and `size` keeps its annotations and its check
    code = """
    from collections import deque


    class Buffer:
        def __init__(self, capacity: int) -> None:
            self.buffer = {"recent": deque(maxlen=capacity)}

        def size(self, scale: int) -> int:
            return len(self.buffer) * scale
    """
    added = {
        ".a.Buffer.__init__": SimpleNamespace(params={"capacity": "int"}, returns="None"),
        ".a.Buffer.size": SimpleNamespace(params={"scale": "int"}, returns="int"),
    }
    checked = typecheck.check(_package(code), "pkg", added)
    assert checked.result == "clean"
    assert rounds == [1, 0]
    assert checked.no_type_check == ()
    assert checked.removed == ("a.Buffer.__init__(capacity)", "a.Buffer.__init__(return)")
    assert checked.untyped == ("a.Buffer.__init__",)
    code = checked.files["pkg/a.py"]
    assert "    def __init__(self, capacity):\n" in code
    assert "    def size(self, scale: int) -> int:\n" in code


def test_a_call_that_unpacks_an_untyped_sequence_decorates_the_caller_not_the_callee(
    rounds: list[int],
) -> None:
    # Dive into DL 3.16's `train(net, *data, num_epochs, ...)`: once `parts` is decorated its
    # result is Any, and mypy maps `*data` onto every positional parameter ("Too many
    # arguments", `epochs` checked against `scale`). The callee's annotations are not the
    # cause and stay; the caller, whose own call fails, is decorated
    code = """
    def parts(x: int) -> tuple[int, int]:
        y: str = 1
        return x, x


    def fit(a: int, b: int, epochs: int, *, scale: float) -> float:
        return (a + b) * scale * epochs


    def k_fold(x: int, epochs: int, scale: float) -> float:
        data = parts(x)
        return fit(*data, epochs, scale=scale)
    """
    added = {
        ".a.parts": SimpleNamespace(params={"x": "int"}, returns="tuple[int, int]"),
        ".a.fit": SimpleNamespace(
            params={"a": "int", "b": "int", "epochs": "int", "scale": "float"}, returns="float"
        ),
        ".a.k_fold": SimpleNamespace(
            params={"x": "int", "epochs": "int", "scale": "float"}, returns="float"
        ),
    }
    checked = typecheck.check(_package(code), "pkg", added)
    assert checked.result == "clean"
    assert [where for where, _ in checked.no_type_check] == ["a.k_fold", "a.parts"]
    assert checked.removed == ()
    fit = "def fit(a: int, b: int, epochs: int, *, scale: float) -> float:"
    assert fit in checked.files["pkg/a.py"]


def test_an_error_about_another_call_on_a_line_that_unpacks_still_drops_the_annotations(
    rounds: list[int],
) -> None:
    # `loss_fn(model(*batch), target)`: the error is about `loss_fn`'s argument, not about the
    # call that unpacks, so `loss_fn`'s annotations go as for any argument error
    code = """
    def loss_fn(pred: float, target: int) -> float:
        return pred


    def model(a: float, b: float) -> float:
        return a + b


    def step(batch: tuple[float, float], target: str) -> float:
        return loss_fn(model(*batch), target)
    """
    added = {
        ".a.loss_fn": SimpleNamespace(params={"pred": "float", "target": "int"}, returns=None),
        ".a.model": SimpleNamespace(params={"a": "float", "b": "float"}, returns=None),
        ".a.step": SimpleNamespace(params={"batch": "tuple[float, float]"}, returns=None),
    }
    checked = typecheck.check(_package(code), "pkg", added)
    assert checked.result == "clean"
    assert rounds == [1, 0]
    assert checked.removed == ("a.loss_fn(pred)", "a.loss_fn(target)")
    assert checked.no_type_check == ()
