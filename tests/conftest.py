from __future__ import annotations

import gc

import pytest

pytest_plugins = ["pytest_jupyter.jupyter_server"]


# The files that take minutes, longest first. `make test` runs two workers, a whole file to each
# (`--dist loadfile`), handed out in collection order (`--no-loadscope-reorder`; xdist's own order,
# by number of tests, left the browser's and the wheel's few long tests to the end): these start
# first, and the many short files fill in around them, so the two workers end together.
FIRST = (
    "test_refactor.py", "test_browser.py", "test_notebooks.py", "test_wheel.py",
    "test_refactor_types.py", "test_deploy.py", "test_refactor_dataflow.py",
    "test_refactor_equivalence.py", "test_refactor_corpus_tests.py", "test_sweep.py",
)  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest files first (`FIRST`); `gpu` tests run on a machine where torch sees a CUDA
    GPU, and skip elsewhere."""
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # stable: order kept within
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _own_working_directory(
    tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run records and default checkpoints land beside the notebook or in the working directory:
    keep every test's in its own temporary folder, never in the checkout."""
    monkeypatch.chdir(tmp_path)  # type: ignore[arg-type]
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)


@pytest.fixture(autouse=True)
def _fresh_module_state() -> None:
    """No test sees the last run, the active session or the rewrite cache of another."""
    from jupyter_trainmate._state import reset

    reset()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Every IPython shell a test made registered an exit hook that runs `gc.collect()` (its
    display hook's flush): hundreds of full collections over this process's heap kept pytest
    from exiting for about 7 minutes after the last test. Frozen objects are not traversed."""
    gc.freeze()
