"""`cell.transformed`: IPython's transform of a `%%train` cell, cached only where IPython's answer
cannot depend on the session."""

from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell

from jupyter_trainmate import cell as cell_module
from jupyter_trainmate.cell import transformed

CELLS = [
    "for x in range(3):\n    y = x\n",
    "files = !ls\nfor f in files:\n    print(f)\n",
    "%time z = 1\nw = %who_ls\n",
    "    indented = 1\n    more = 2\n",
    ">>> a = 1\n>>> b = 2\n",
    "x = 1",  # one line: IPython's prefilter runs on it, never cached
    "%%capture\nprint(1)\nprint(2)\n",  # a cell magic: one line after the static transforms
]


@pytest.fixture
def ip() -> InteractiveShell:
    cell_module._TRANSFORMED.clear()
    return InteractiveShell.instance()


@pytest.mark.parametrize("text", CELLS)
def test_transformed_is_ipythons_transform_first_and_again(ip: InteractiveShell, text: str) -> None:
    expected = ip.transform_cell(text)
    assert transformed(ip, text) == expected
    assert transformed(ip, text) == expected


def test_a_multi_line_cell_is_transformed_once(
    ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = CELLS[1]
    first = transformed(ip, text)

    def refuse(cell: str) -> str:
        raise AssertionError("transformed again")

    monkeypatch.setattr(ip.input_transformer_manager, "transform_cell", refuse)
    assert transformed(ip, text) == first
    with pytest.raises(AssertionError):  # a one-line cell is never cached
        transformed(ip, "x = 1")


def test_post_transforms_and_changed_transformer_lists_are_not_served_from_the_cache(
    ip: InteractiveShell,
) -> None:
    text = CELLS[0]
    plain = transformed(ip, text)

    def shout(lines: list[str]) -> list[str]:
        return [line.replace("y = x", "y = -x") for line in lines]

    ip.input_transformers_post.append(shout)
    try:
        assert transformed(ip, text) == plain.replace("y = x", "y = -x")
    finally:
        ip.input_transformers_post.remove(shout)
    manager = ip.input_transformer_manager
    manager.line_transforms.append(shout)
    try:
        assert transformed(ip, text) == plain.replace("y = x", "y = -x")
    finally:
        manager.line_transforms.remove(shout)
    assert transformed(ip, text) == plain


def test_the_cache_keeps_the_newest_cells(ip: InteractiveShell) -> None:
    for n in range(cell_module._TRANSFORMED_MOST + 5):
        transformed(ip, f"a = {n}\nb = {n}\n")
    assert len(cell_module._TRANSFORMED) == cell_module._TRANSFORMED_MOST
    assert any(key[0] == "a = 68\nb = 68\n" for key in cell_module._TRANSFORMED)
    assert not any(key[0] == "a = 0\nb = 0\n" for key in cell_module._TRANSFORMED)


def test_an_unhashable_transform_is_run_not_cached(ip: InteractiveShell) -> None:
    class Shout:
        __hash__ = None  # type: ignore[assignment]  # what defining __eq__ alone does

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Shout)

        def __call__(self, lines: list[str]) -> list[str]:
            return [line.replace("y = x", "y = -x") for line in lines]

    text = CELLS[0]
    manager = ip.input_transformer_manager
    shout = Shout()
    manager.cleanup_transforms.append(shout)
    try:
        assert transformed(ip, text) == ip.transform_cell(text)
        assert "y = -x" in transformed(ip, text)
    finally:
        manager.cleanup_transforms.remove(shout)
    assert not cell_module._TRANSFORMED
