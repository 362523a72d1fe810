"""The `%%train` transformers, one idiom at a time: source before, source after and the notes.

In the style of LibCST's `CodemodTest`: through the pure rewrite entry points (`rewrite_source`,
`rewrite_cell` with a namespace standing in for the notebook's), no IPython shell, no training.
Notebook functions and classes are defined the way IPython defines them: compiled under a cell
file name whose lines are registered in `linecache`, in a namespace named `__main__`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import linecache
import sys
import textwrap
import types
from pathlib import Path

import pytest

import jupyter_trainmate.rewrite as rewrite
from jupyter_trainmate.rewrite import RewriteResult, rewrite_cell, rewrite_source
from jupyter_trainmate.rewrite.context import RewriteContext
from jupyter_trainmate.rewrite.functions import is_cell_file
from jupyter_trainmate.rewrite.install import Installed, compile_function

RETRY = "  # %%train oom-retry"


def check(
    before: str, after: str, notes: list[str], trainers: frozenset[str] = frozenset()
) -> None:
    """`before` rewrites to exactly `after`, with exactly `notes` (as `--show` prints them)."""
    context = RewriteContext()
    code, _ = rewrite_source(textwrap.dedent(before), context, trainers)
    assert code == textwrap.dedent(after).replace("  # RETRY", RETRY)
    assert [str(n) for n in context.sorted_notes()] == notes


def cell(source: str, namespace: dict[str, object], name: str) -> None:
    """Run `source` as IPython runs a cell: compiled under a cell file registered in linecache."""
    source = textwrap.dedent(source)
    linecache.cache[name] = (len(source), None, source.splitlines(keepends=True), name)
    exec(compile(source, name, "exec"), namespace)


@pytest.fixture
def notebook() -> dict[str, object]:
    """A notebook namespace; its cells are named as ipykernel names them, outside /tmp."""
    namespace: dict[str, object] = {"__name__": "__main__", "loader": [], "model": None}
    names = iter(f"/home/user/.cache/ipykernel_1/{n}.py" for n in range(100))
    namespace["_cell"] = lambda source: cell(source, namespace, next(names))
    return namespace


def run_cells(namespace: dict[str, object], *sources: str) -> None:
    for source in sources:
        namespace["_cell"](source)  # type: ignore[operator]


def notes_of(result: RewriteResult) -> list[str]:
    return [str(n) for n in result.notes]


# -- batch and epoch loops -----------------------------------------------------------------------


def test_batch_loop_is_timed_and_gets_a_retry_point() -> None:
    check(
        """\
        for xb, yb in loader:
            loss = loss_fn(model(xb), yb)
            loss.backward()
        """,
        """\
        for xb, yb in __trainmate__.batches(loader):
            for xb, yb in __trainmate__.parts((xb, yb), ("loss",)):  # RETRY
                try:  # RETRY
                    loss = loss_fn(model(xb), yb)
                    __trainmate__.backward(loss)
                except __trainmate__.oom_errors:  # RETRY
                    if not __trainmate__.oom_guard.caught(): raise  # RETRY
        """,
        [
            "instrumented cell line 1: batch loop over loader (timed; prefetched per --prefetch; "
            "retried as micro-batches on out-of-memory)",
            "instrumented cell line 3: loss.backward()",
        ],
    )


def test_epoch_loop_around_a_batch_loop_counts_epochs_enumerate_and_tqdm_stay_outside() -> None:
    check(
        """\
        for epoch in range(3):
            for i, (xb, yb) in enumerate(tqdm(loader)):
                model(xb).sum().backward()
        """,
        """\
        for epoch in __trainmate__.epochs(range(3)):
            for i, (xb, yb) in enumerate(tqdm(__trainmate__.batches(loader)), start=__trainmate__.resumed_start(0)):
                for (xb, yb) in __trainmate__.parts((xb, yb), ()):  # RETRY
                    try:  # RETRY
                        __trainmate__.backward(model(xb).sum())
                    except __trainmate__.oom_errors:  # RETRY
                        if not __trainmate__.oom_guard.caught(): raise  # RETRY
        """,
        [
            "instrumented cell line 1: epoch loop over range(3) (progress and ETA)",
            "instrumented cell line 2: batch loop over enumerate(tqdm(loader)) (timed; prefetched "
            "per --prefetch; retried as micro-batches on out-of-memory)",
            "instrumented cell line 3: model(xb).sum().backward()",
        ],
    )


def test_a_counter_loop_is_watched_and_the_session_learns_what_its_passes_are() -> None:
    """Steps (it draws its own data) or epochs (a batch loop runs inside, maybe in a function)."""
    check(
        """\
        for step in range(100):
            model(x).sum().backward()
            opt.step()
        """,
        """\
        for step in __trainmate__.loop(range(100)):
            __trainmate__.backward(model(x).sum())
            __trainmate__.step(opt)
        """,
        [
            "instrumented cell line 1: loop over range(100) (each pass that trains is a step; "
            "passes holding other training loops are epochs)",
            "instrumented cell line 2: model(x).sum().backward()",
            "instrumented cell line 3: opt.step()",
        ],
    )


def test_a_counter_loop_inside_the_batch_loop_is_left_alone() -> None:
    check(
        """\
        for real in loader:
            for _ in range(3):
                critic(real).mean().backward()
        """,
        """\
        for real in __trainmate__.batches(loader):
            for real in __trainmate__.parts(real, ()):  # RETRY
                try:  # RETRY
                    for _ in range(3):
                        __trainmate__.backward(critic(real).mean())
                except __trainmate__.oom_errors:  # RETRY
                    if not __trainmate__.oom_guard.caught(): raise  # RETRY
        """,
        [
            "instrumented cell line 1: batch loop over loader (timed; prefetched per --prefetch; "
            "retried as micro-batches on out-of-memory)",
            "left alone   cell line 2: loop over range(3) (inside the batch loop: the batch is the "
            "step)",
            "instrumented cell line 3: critic(real).mean().backward()",
        ],
    )


def test_a_loop_over_the_notebooks_models_is_not_the_batch_loop() -> None:
    import torch

    nets = [torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)]
    namespace = {"nets": nets, "opts": [torch.optim.SGD(n.parameters(), lr=0.1) for n in nets]}
    source = (
        "for xb in loader:\n    for net, o in zip(nets, opts):\n        net(xb).sum().backward()\n"
    )
    result = rewrite_cell(source, namespace)
    assert "for xb in __trainmate__.batches(loader):" in result.code
    assert notes_of(result) == [
        "instrumented cell line 1: batch loop over loader (timed; prefetched per --prefetch; "
        "retried as micro-batches on out-of-memory)",
        "left alone   cell line 2: loop over zip(nets, opts) (inside the batch loop: the batch is "
        "the step)",
        "instrumented cell line 3: net(xb).sum().backward()",
    ]


def test_a_break_keeps_leaving_the_batch_loop_under_the_retry_point() -> None:
    check(
        """\
        for xb in loader:
            model(xb).sum().backward()
            break
        """,
        """\
        for xb in __trainmate__.batches(loader):
            for xb in __trainmate__.parts(xb, ()):  # RETRY
                try:  # RETRY
                    __trainmate__.backward(model(xb).sum())
                    break
                except __trainmate__.oom_errors:  # RETRY
                    if not __trainmate__.oom_guard.caught(): raise  # RETRY
            else:  # RETRY
                continue  # RETRY
            break  # RETRY
        """,
        [
            "instrumented cell line 1: batch loop over loader (timed; prefetched per --prefetch; "
            "retried as micro-batches on out-of-memory)",
            "instrumented cell line 2: model(xb).sum().backward()",
        ],
    )


def test_async_loops_are_left_alone() -> None:
    check(
        """\
        async for xb in stream:
            model(xb).sum().backward()
        """,
        """\
        async for xb in stream:
            __trainmate__.backward(model(xb).sum())
        """,
        [
            "left alone   cell line 1: async loop over stream (async iteration)",
            "instrumented cell line 2: model(xb).sum().backward()",
        ],
    )


def test_comprehension_over_batches_is_timed() -> None:
    check(
        "losses = [step(xb) for epoch in range(2) for xb in loader]\n",
        "losses = [step(xb) for epoch in range(2) for xb in __trainmate__.batches(loader)]\n",
        ["instrumented cell line 1: batch comprehension over loader (timed)"],
        trainers=frozenset({"step"}),
    )


def test_next_on_a_batch_iterator_in_a_training_loop_is_timed() -> None:
    check(
        """\
        it = iter(loader)
        while True:
            xb = next(it, None)
            model(xb).sum().backward()
        """,
        """\
        it = iter(loader)
        while True:
            xb = __trainmate__.next_batch(it, None)
            __trainmate__.backward(model(xb).sum())
        """,
        [
            "instrumented cell line 3: next() on a batch iterator (timed)",
            "instrumented cell line 4: model(xb).sum().backward()",
        ],
    )


# -- training calls ------------------------------------------------------------------------------


def test_step_zero_grad_and_every_clipping_name_go_through_the_session() -> None:
    check(
        """\
        opt.zero_grad()
        loss.backward(retain_graph=True)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        torch.nn.utils.clip_grad_norm(model.parameters(), max_norm=1.0)
        clip_grad_value_(model.parameters(), 0.5)
        opt.step()
        sched.step()
        """,
        """\
        __trainmate__.zero_grad(opt)
        __trainmate__.backward_kw(loss, retain_graph=True)
        __trainmate__.clip_grad_norm_(model.parameters(), 1.0)
        __trainmate__.clip_grad_norm_(model.parameters(), max_norm=1.0)
        __trainmate__.clip_grad_value_(model.parameters(), 0.5)
        __trainmate__.step(opt)
        __trainmate__.step(sched)
        """,
        [
            "instrumented cell line 1: opt.zero_grad()",
            "instrumented cell line 2: loss.backward()",
            "instrumented cell line 3: clip_grad_norm_() (unscaled first under fp16, on real steps)",
            "instrumented cell line 4: clip_grad_norm() (unscaled first under fp16, on real steps)",
            "instrumented cell line 5: clip_grad_value_() (unscaled first under fp16, on real steps)",
            "instrumented cell line 6: opt.step()",
            "instrumented cell line 7: sched.step()",
        ],
    )


def test_gradient_reads_it_cannot_unscale_are_noted_and_in_the_facts() -> None:
    source = textwrap.dedent(
        """\
        for p in model.parameters():
            p.grad.data.clamp_(-1, 1)
            if p.grad is None or p.grad.abs().max() > 9:
                p.grad = None
            p.grad.zero_()
        g = torch.autograd.grad(loss, x)
        my_clip_grad(model, 1.0)
        """
    )
    context = RewriteContext()
    code, facts = rewrite_source(source, context)
    assert code == source
    assert facts.gradient_reads == ((2, "p.grad.data"), (3, "p.grad"), (7, "my_clip_grad()"))
    assert [n.where for n in context.notes] == ["cell line 2", "cell line 3", "cell line 7"]
    assert all("--amp fp16 is refused" in n.reason for n in context.notes)


# -- magics --------------------------------------------------------------------------------------


def test_time_line_and_cell_magics_are_rewritten_inside() -> None:
    body = "for xb in loader:\n    model(xb).sum().backward()\n"
    before = (
        "get_ipython().run_line_magic('time', 'loss.backward()')\n"
        f"get_ipython().run_cell_magic('time', '', {body!r})\n"
    )
    context = RewriteContext()
    code, facts = rewrite_source(before, context)
    line, cell_magic = code.splitlines()
    assert line == "get_ipython().run_line_magic('time', '__trainmate__.backward(loss)')"
    inner = eval(cell_magic.removeprefix("get_ipython().run_cell_magic('time', '', ").rstrip(")"))
    assert inner.startswith("for xb in __trainmate__.batches(loader):\n")
    assert "__trainmate__.backward(model(xb).sum())" in inner
    assert facts.backward_calls == 2
    assert [str(n) for n in context.sorted_notes()] == [
        "instrumented cell line 1: loss.backward() under %time",
        # the %%time body starts on the line after the magic's: lines 3 and 4 of the cell
        "instrumented cell line 3: batch loop over loader under %%time (timed; prefetched per "
        "--prefetch; retried as micro-batches on out-of-memory)",
        "instrumented cell line 4: model(xb).sum().backward() under %%time",
    ]


def test_magics_that_run_code_themselves_are_noted() -> None:
    check(
        "get_ipython().run_line_magic('timeit', 'fit()')\n"
        "get_ipython().run_line_magic('matplotlib', 'inline')\n"
        "get_ipython().run_cell_magic('capture', 'out', 'fit()\\n')\n",
        "get_ipython().run_line_magic('timeit', 'fit()')\n"
        "get_ipython().run_line_magic('matplotlib', 'inline')\n"
        "get_ipython().run_cell_magic('capture', 'out', 'fit()\\n')\n",
        [
            "left alone   cell line 1: %timeit fit() (the line magic runs this code itself; "
            "%%train cannot rewrite it (optimizer hooks still count its steps))",
            "left alone   cell line 3: %%capture fit() (the cell magic runs this code itself; "
            "%%train cannot rewrite it (optimizer hooks still count its steps))",
        ],
    )


# -- notebook functions and methods --------------------------------------------------------------

FIT = """\
x0 = 1

def fit(epochs):
    for _ in range(epochs):
        for xb in loader:
            step(xb)

def step(xb):
    model(xb).sum().backward()
"""


def test_notebook_functions_are_found_by_their_cell_not_a_tmp_path(
    notebook: dict[str, object],
) -> None:
    run_cells(notebook, FIT)
    fit = notebook["fit"]
    assert isinstance(fit, types.FunctionType)
    assert not fit.__code__.co_filename.startswith("/tmp")
    assert is_cell_file(fit.__code__.co_filename)
    result = rewrite_cell("fit(3)\n", notebook)
    assert [fn.original.name for fn in result.functions] == ["fit", "step"]
    assert notes_of(result) == [
        "instrumented function fit line 4: epoch loop over range(epochs) (progress and ETA)",
        "instrumented function fit line 5: batch loop over loader (timed; prefetched per "
        "--prefetch; retried as micro-batches on out-of-memory)",
        "instrumented function step line 9: model(xb).sum().backward()",
    ]
    assert (
        result.functions[1].code == "def step(xb):\n    __trainmate__.backward(model(xb).sum())\n"
    )


def test_code_in_a_real_file_is_not_a_notebook_function(tmp_path: Path) -> None:
    path = tmp_path / "helpers.py"
    path.write_text(
        "def fit():\n    model.sum().backward()\n\n"
        "class Trainer:\n    def fit(self):\n        model.sum().backward()\n"
    )
    spec = importlib.util.spec_from_file_location("helpers", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["helpers"] = module
    try:
        spec.loader.exec_module(module)
        assert not is_cell_file(str(path))
        namespace = {"fit": module.fit, "helpers": module, "trainer": module.Trainer()}
        result = rewrite_cell("fit()\nhelpers.fit()\ntrainer.fit()\n", namespace)
    finally:
        del sys.modules["helpers"]
    assert result.functions == ()
    reason = "code in imported modules is not rewritten; optimizer hooks still count its steps"
    assert notes_of(result) == [
        f"left alone   cell: fit() from {path} ({reason})",
        f"left alone   cell: helpers.fit() from {path} ({reason})",
        f"left alone   method Trainer.fit: from {path} ({reason})",
    ]


def test_a_function_passed_as_an_argument_is_reached(notebook: dict[str, object]) -> None:
    run_cells(notebook, FIT)
    result = rewrite_cell("run_example(step)\n", notebook)
    assert [fn.original.name for fn in result.functions] == ["step"]


def test_a_decorated_notebook_function_that_trains_is_noted(notebook: dict[str, object]) -> None:
    run_cells(notebook, "import functools\n@functools.lru_cache\ndef fit():\n    loss.backward()\n")
    result = rewrite_cell("fit.__wrapped__()\nfit()\n", notebook)
    assert result.functions == ()
    assert notes_of(result) == []  # an lru_cache wrapper is not a function: nothing to say
    run_cells(notebook, "def deco(f):\n    return f\n@deco\ndef fit():\n    loss.backward()\n")
    result = rewrite_cell("fit()\n", notebook)
    assert notes_of(result) == [
        "left alone   function fit: its training calls (not rewritten: it is decorated: the "
        "decorator may wrap it)"
    ]


TRAINER = """\
class Base:
    def one_batch(self, xb):
        self.__seen = xb
        model(xb).sum().backward()
        self.opt.step()

class Trainer(Base):
    def one_batch(self, xb):
        super().one_batch(xb)
        self.opt.zero_grad()

    def fit(self):
        for xb in self.loader:
            self.one_batch(xb)

trainer = Trainer()
fit = trainer.fit
"""


def test_methods_are_reached_through_instances_self_super_and_bound_names(
    notebook: dict[str, object],
) -> None:
    run_cells(notebook, TRAINER)
    result = rewrite_cell("trainer.fit()\nfit()\n", notebook)
    names = {fn.original.name: fn for fn in result.functions}
    assert set(names) == {"Trainer.fit", "Trainer.one_batch", "Base.one_batch"}
    assert names["Trainer.fit"].bound_names == ("fit",)
    assert names["Trainer.fit"].code == textwrap.dedent(
        """\
        class Trainer:
            def fit(self):
                for xb in __trainmate__.batches(self.loader):
                    for xb in __trainmate__.parts(xb, ()):  # RETRY
                        try:  # RETRY
                            self.one_batch(xb)
                        except __trainmate__.oom_errors:  # RETRY
                            if not __trainmate__.oom_guard.caught(): raise  # RETRY
        """
    ).replace("  # RETRY", RETRY)
    assert "instrumented method Base.one_batch line 4: model(xb).sum().backward()" in notes_of(
        result
    )


def test_installed_methods_keep_super_mangling_and_are_put_back(
    notebook: dict[str, object],
) -> None:
    run_cells(notebook, TRAINER)
    result = rewrite_cell("trainer.fit()\nfit()\n", notebook)
    base, trainer_cls = notebook["Base"], notebook["Trainer"]
    assert isinstance(base, type)
    assert isinstance(trainer_cls, type)
    before = (dict(vars(base)), dict(vars(trainer_cls)), notebook["fit"])
    installed = Installed(result, notebook)
    installed.install(session=None)
    try:
        new_fit = vars(trainer_cls)["fit"]
        assert new_fit is not before[1]["fit"]
        assert new_fit.__qualname__ == "Trainer.fit"
        assert new_fit.__code__.co_filename == before[1]["fit"].__code__.co_filename
        assert new_fit.__code__.co_firstlineno == 12  # the user's own line in the cell
        assert notebook["fit"].__func__ is new_fit  # type: ignore[attr-defined]
        one_batch = vars(base)["one_batch"]
        assert "_Base__seen" in one_batch.__code__.co_names  # private names mangled as before
        sub = vars(trainer_cls)["one_batch"]
        assert sub.__closure__[0].cell_contents is trainer_cls  # super() means the real class
    finally:
        installed.undo()
    assert (dict(vars(base)), dict(vars(trainer_cls)), notebook["fit"]) == before


def test_compiled_function_keeps_its_cell_lines(notebook: dict[str, object]) -> None:
    run_cells(notebook, FIT)
    result = rewrite_cell("fit(3)\n", notebook)
    fit = compile_function(result.functions[0])
    assert fit.__code__.co_firstlineno == 3
    assert fit.__code__.co_filename == notebook["fit"].__code__.co_filename  # type: ignore[attr-defined]


# -- the cache -----------------------------------------------------------------------------------


def test_a_cached_result_is_immutable_and_reused_until_a_name_changes(
    notebook: dict[str, object],
) -> None:
    run_cells(notebook, FIT)
    first = rewrite_cell("fit(3)\n", notebook)
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.code = ""  # type: ignore[misc]
    assert isinstance(first.notes, tuple)
    assert isinstance(first.functions, tuple)
    assert isinstance(first.facts.training_loops, frozenset)
    assert rewrite_cell("fit(3)\n", notebook) is first
    run_cells(notebook, FIT)  # `fit` redefined
    assert rewrite_cell("fit(3)\n", notebook) is not first
    # the values a cell passes around change every run; only their types count
    loop = "for xb in loader:\n    step(xb)\n"
    notebook["xb"] = 1
    second = rewrite_cell(loop, notebook)
    notebook["xb"] = 2
    assert rewrite_cell(loop, notebook) is second
    notebook["xb"] = "a string"
    assert rewrite_cell(loop, notebook) is not second


def test_a_cell_libcst_cannot_parse_runs_unchanged_with_a_note() -> None:
    result = rewrite_cell("print 1\n")
    assert result.code == "print 1\n"
    assert len(result.notes) == 1
    assert result.notes[0].what == "the whole cell"
    assert rewrite.RewriteResult is RewriteResult
