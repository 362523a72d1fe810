"""`trainmate refactor`'s types: static inference through the package's dataflow (small
before/after sources, no notebook run), mypy on what is annotated with `@no_type_check` only where
a function's own code fails, and generated model tests whose integer inputs keep to the recorded
ranges."""

from __future__ import annotations

import re
import subprocess
import textwrap
from pathlib import Path

import nbformat
import pytest

from refactor.annotate import annotate
from refactor.output import ruff
from tests.test_refactor import NOTEBOOKS, generated_tests, mypy, trainmate

HEADER = "from __future__ import annotations\n\n"


def typed(**modules: str) -> dict[str, str]:
    """Annotate a package `pkg` made of `modules` (name -> source) without mypy; by module."""
    files = {f"pkg/{name}.py": HEADER + textwrap.dedent(code) for name, code in modules.items()}
    out = annotate(files, "pkg", typecheck=False).files
    return {name: formatted(out[f"pkg/{name}.py"]) for name in modules}


def formatted(code: str) -> str:
    """As the refactor writes it (`ruff format`), long lines kept whole for the assertions."""
    proc = subprocess.run(
        [ruff(), "format", "--line-length", "200", "-"],
        input=code, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return proc.stdout


def test_a_constructed_object_flows_into_the_functions_it_is_passed_to() -> None:
    out = typed(
        model="""
        import torch
        from torch import nn
        from torch.utils.data import DataLoader

        class Net(nn.Module):
            def forward(self, x):
                return x

        class Head(nn.Module):
            def __init__(self, k):
                super(Head, self).__init__()  # naming the class is not handing it on

        def fit(model, loader, opt, epochs):
            pass

        def run():
            model = Net().to("cpu")
            loader = DataLoader([1, 2], batch_size=2)
            opt = torch.optim.Adam(model.parameters())
            fit(model, loader, opt, epochs=3)
            fit(model, loader, torch.optim.SGD(model.parameters(), lr=0.1), epochs=3)
            Head(3)
        """
    )["model"]
    assert "def __init__(self, k: int) -> None:" in out
    # Adam and SGD: their common base, by the names the module imports
    assert "def fit(model: Net, loader: DataLoader, opt: torch.optim.Optimizer, epochs: int)" in out


def test_arguments_of_sibling_classes_join_to_their_union_or_common_base() -> None:
    # the package's own models join to their union, up to three (RL-Adventure's
    # `current_model`, a `RainbowDQN` then a `RainbowCnnDQN`): `nn.Module` has none of their
    # methods, and mypy rejected it for `current_model.act(state)`; more than three, the base.
    # A union is still a model: `.train()` gives it back, calling it gives what `forward` does.
    # A member deriving from another is in the union already (`E(A)`).
    out = typed(
        model="""
        import torch
        from torch import nn

        class A(nn.Module):
            def forward(self, x):
                return x * 2

        class B(nn.Module):
            def forward(self, x):
                return x + 1

        class C(nn.Module):
            pass

        class D(nn.Module):
            pass

        class E(A):
            pass

        def count(m):
            return sum(p.numel() for p in m.parameters())

        def size(m):
            return sum(p.numel() for p in m.parameters())

        def prepare(m):
            return m.train()

        def predict(m, x):
            return m(x)

        def width(m):
            return sum(p.numel() for p in m.parameters())

        def show(value):
            print(value)

        def scale(x, factor):
            return x * factor

        def run():
            count(A())
            count(B())
            size(A())
            size(B())
            size(C())
            size(D())
            prepare(A())
            prepare(B())
            predict(A(), torch.zeros(2))
            predict(B(), torch.ones(2))
            width(A())
            width(E())
            width(B())
            show(1)
            show("one")
            scale(2, 3)
            scale(2, 0.5)
        """
    )["model"]
    assert "def count(m: A | B):" in out
    assert "def size(m: nn.Module):" in out
    assert "def prepare(m: A | B) -> A | B:" in out
    assert "def predict(m: A | B, x: torch.Tensor) -> torch.Tensor:" in out
    assert "def width(m: A | B):" in out
    assert "def show(value) -> None:" in out  # int and str share nothing worth writing
    assert "def scale(x: int, factor: float) -> float:" in out


def test_a_module_that_does_not_parse_is_left_to_the_gate_and_the_rest_is_typed() -> None:
    files = {"pkg/bad.py": "x = (1\n", "pkg/good.py": HEADER + "def f():\n    return 1\n"}
    result = annotate(files, "pkg", typecheck=False)
    assert result.files["pkg/bad.py"] == "x = (1\n"
    assert "def f() -> int:" in result.files["pkg/good.py"]
    assert result.coverage.total == 1


def test_type_only_imports_stay_guarded_where_the_module_has_its_own_type_checking_block() -> None:
    out = typed(
        model="""
        from typing import TYPE_CHECKING

        from torch import zeros

        if TYPE_CHECKING:
            from collections.abc import Iterator

        def make():
            return zeros(2)
        """
    )["model"]
    assert "def make() -> Tensor:" in out  # `torch` is not imported: a type-only import
    assert re.search(r"if TYPE_CHECKING:\n    from torch import Tensor", out)
    assert out.count("from typing import TYPE_CHECKING") == 1


def test_a_parameter_passed_straight_to_a_layer_has_the_type_the_layer_needs() -> None:
    out = typed(
        model="""
        from torch import nn

        class MLP(nn.Module):
            def __init__(self, n_in, n_out, p, steps):
                super().__init__()
                self.fc = nn.Linear(n_in, n_out)
                self.drop = nn.Dropout(p=p)
                for _ in range(steps):
                    pass

        def run(env):
            MLP(env.n_in, env.n_out, env.p, env.steps)
        """
    )["model"]
    assert "def __init__(self, n_in: int, n_out: int, p: float, steps: int) -> None:" in out
    assert "def run(env) -> None:" in out  # an environment of unknown type stays unannotated


def test_returns_come_from_what_is_returned_and_known_library_calls() -> None:
    out = typed(
        data="""
        import numpy as np
        import pandas as pd
        import torch

        def make(n):
            return torch.zeros(n, 3), n

        def frame(path):
            return pd.read_csv(path)

        def arr():
            return np.array([1, 2])

        def size(xs):
            return len(xs)

        def history(n):
            losses = []
            for _ in range(n):
                losses.append(torch.ones(()).item())
            return losses

        def loss_value(loss):
            return loss.item()

        def label(i):
            if i > 0:
                return "pos"
            return "neg"

        def maybe(i):
            if i > 0:
                return 1.5

        def run():
            make(4)
            frame("a.csv")
            size([1, 2])
            history(3)
            loss_value(torch.ones(()).sum())
            label(3)
            maybe(2)
        """
    )["data"]
    assert "def make(n: int) -> tuple[torch.Tensor, int]:" in out
    assert "def frame(path: str) -> pd.DataFrame:" in out
    assert "def arr() -> np.ndarray:" in out
    assert "def size(xs: list[int]) -> int:" in out
    assert "def history(n: int) -> list[float]:" in out  # the items appended to `[]`
    assert "def loss_value(loss: torch.Tensor) -> float:" in out
    assert "def label(i: int) -> str:" in out
    assert "def maybe(i: int) -> float | None:" in out


def test_a_callback_gets_no_parameter_types_and_a_rebound_parameter_keeps_its_type() -> None:
    out = typed(
        data="""
        import torch
        from torch.utils.data import DataLoader

        def collate(batch):
            return torch.stack(batch)

        def prepare(x, device):
            x = x.to(device)
            x = x.float()
            return x

        def run():
            device = torch.device("cpu")
            loader = DataLoader([torch.zeros(2)], collate_fn=collate)
            prepare(torch.ones(2), device)
        """
    )["data"]
    assert "def collate(batch) -> torch.Tensor:" in out  # called by DataLoader: with what, unseen
    assert (
        "def prepare(x: torch.Tensor, device: torch.device) -> torch.Tensor:" in out
    )  # `device`: a name here


def test_section_functions_and_run_are_typed_generically_across_modules() -> None:
    out = typed(
        config="""
        from dataclasses import dataclass

        LR = 0.01

        @dataclass
        class Config:
            lr: float = LR
            n: int = 8
        """,
        data="""
        import torch

        from .config import Config

        def load_data(config: Config):
            x = torch.randn(config.n, 4)
            y = torch.randint(0, 2, (config.n,))
            return x, y
        """,
        train="""
        import jupyter_trainmate
        from torch import nn

        from .config import LR, Config
        from .data import load_data

        def build_model(width):
            return nn.Linear(4, width)

        def sizes(config: Config) -> tuple[int, int]:
            return config.n, 2 * config.n

        def report(n_train):
            print(n_train)

        def step(model, x, y, *, lr=LR):
            out = model(x)
            return nn.functional.cross_entropy(out, y)

        def train_cell_9(*, model, x):
            return model(x)

        def run(config: Config) -> dict[str, object]:
            x, y = load_data(config)
            model = build_model(2)
            n_train, n_valid = sizes(config)
            report(n_train)
            loss = step(model, x, y, lr=config.lr)
            out = jupyter_trainmate.train(train_cell_9, "--epochs 1", model=model, x=x)
            return {"loss": loss, "out": out}
        """,
    )
    assert "def load_data(config: Config) -> tuple[torch.Tensor, torch.Tensor]:" in out["data"]
    train = out["train"]
    assert "def build_model(width: int) -> nn.Linear:" in train
    assert "def report(n_train: int) -> None:" in train  # through a written return type
    assert "def step(model: nn.Linear, x: Tensor, y: Tensor, *, lr: float = LR) -> Tensor:" in train
    assert "def train_cell_9(*, model: nn.Linear, x: Tensor) -> Tensor:" in train


# -- through the command: coverage, mypy, @no_type_check ---------------------------------------


@pytest.fixture(scope="module")
def realistic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("types") / "realistic"
    proc = trainmate("refactor", NOTEBOOKS / "realistic_training.ipynb", "-o", out, "--no-docs")
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.slow
def test_static_types_annotate_three_in_four_and_mypy_is_clean(realistic: Path) -> None:
    report = (realistic / "REFACTOR_REPORT.md").read_text()
    found = re.search(r"(\d+) of (\d+) parameters and returns annotated", report)
    assert found is not None
    assert int(found.group(1)) / int(found.group(2)) >= 0.75
    assert "mypy on the package: clean." in report
    assert "`@no_type_check` on 0 functions" in report
    code = "".join(p.read_text() for p in (realistic / "realistic_training").glob("*.py"))
    assert "no_type_check" not in code  # run() and the %%train cell are checked, and pass
    checked = mypy(cwd=realistic, package="realistic_training")
    assert checked.returncode == 0, checked.stdout
    train = (realistic / "realistic_training" / "train.py").read_text()
    assert "def train_cell_81(" in train
    assert "train_loader: DataLoader," in train


def notebook(path: Path, *cells: str) -> Path:
    nb = nbformat.v4.new_notebook()  # type: ignore[no-untyped-call]
    nb.cells = [nbformat.v4.new_code_cell(textwrap.dedent(c).strip()) for c in cells]  # type: ignore[no-untyped-call]
    nbformat.write(nb, path)  # type: ignore[no-untyped-call]
    return path


@pytest.mark.slow
def test_only_the_function_whose_own_code_fails_mypy_gets_no_type_check(tmp_path: Path) -> None:
    source = notebook(
        tmp_path / "mixed.ipynb",
        "import torch",
        """
        def halves(xs):
            total: int = 0  # declared: not a name rebound to a new type (allow_redefinition)
            for x in xs:
                total += x * 0.5
            return total
        """,
        """
        def double(n):
            return n * 2
        """,
        """
        def odd(t):
            return t.not_a_tensor_method()
        """,
        "halves([1, 2, 3])\ndouble(4)",
        "if False:\n    odd(torch.zeros(1))",
    )
    out = tmp_path / "out"
    proc = trainmate("refactor", source, "-o", out, "--no-docs")
    assert proc.returncode == 0, proc.stderr
    code = "".join(p.read_text() for p in (out / "mixed").glob("*.py"))
    assert code.count("@no_type_check") == 1
    assert re.search(r"@no_type_check\ndef halves\(xs: list\[int\]\)", code)
    assert "def double(n: int) -> int:" in code
    assert "def odd(t)" in code  # the annotation mypy rejected was removed, not kept wrong
    report = (out / "REFACTOR_REPORT.md").read_text()
    assert "`@no_type_check` on 1 function (its own code fails mypy):" in report
    assert re.search(r"- `\w+\.halves`: Incompatible types in assignment", report)
    assert "odd(t)" in report  # among the rejected annotations
    checked = mypy(cwd=out, package="mixed")
    assert checked.returncode == 0, checked.stdout


LENGTHS_MODEL = """
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


class Tagger(nn.Module):
    def __init__(self, vocab=50, dim=8, classes=3):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens, lengths):
        packed = pack_padded_sequence(self.emb(tokens), lengths, batch_first=True)
        out, _ = self.lstm(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=tokens.shape[1])
        mean = out.sum(1) / lengths.unsqueeze(1).to(out.dtype)  # a zero length divides by zero
        return self.head(mean)
"""


@pytest.mark.slow
def test_a_model_taking_lengths_gets_a_generated_test_that_passes(tmp_path: Path) -> None:
    source = notebook(
        tmp_path / "lengths.ipynb",
        LENGTHS_MODEL,
        """
        torch.manual_seed(0)
        tokens = torch.randint(1, 50, (6, 10))
        lengths = torch.tensor([10, 9, 7, 5, 4, 3])
        model = Tagger(vocab=50, dim=8, classes=3)
        out = model(tokens, lengths)
        print(out.shape)
        """,
    )
    out = tmp_path / "out"
    proc = trainmate("refactor", source, "-o", out, "--execute", "--no-docs")
    assert proc.returncode == 0, proc.stderr
    tests = (out / "tests" / "test_models.py").read_text()
    low = re.search(r"torch\.randint\((\d+), 50, \(4, 10\), dtype=torch\.int64\)", tests)
    assert low is not None
    assert int(low.group(1)) >= 1
    assert "torch.randint(3, 11, (4,), dtype=torch.int64).sort(descending=True).values" in tests
    for _ in range(3):
        ran = generated_tests(cwd=out)
        assert ran.returncode == 0, ran.stdout[-3000:]
        assert re.search(r"\b(\d+) passed", ran.stdout)
        assert "failed" not in ran.stdout
        assert "skipped" not in ran.stdout


def test_a_value_of_unknown_type_used_as_a_tensor_is_a_tensor() -> None:
    out = typed(
        model="""
        import torch
        from somewhere import load

        def first(x):
            return x

        def flat(x):
            return x

        def labels(y):
            return y

        def as_array(a):
            return a

        def reshaped(r):
            return r

        def run():
            data = load()
            first(data.unsqueeze(0))
            flat(data.view(-1, 16))
            labels(data.long())
            as_array(data.numpy())
            reshaped(data.reshape(4, 4))  # numpy arrays too: not a tensor for sure
            reshaped(data.view(torch.float16))
        """
    )["model"]
    assert "def first(x: torch.Tensor) -> torch.Tensor:" in out
    assert "def flat(x: torch.Tensor) -> torch.Tensor:" in out
    assert "def labels(y: torch.Tensor) -> torch.Tensor:" in out
    assert "def as_array(a: ndarray) -> ndarray:" in out  # numpy is not imported: by name
    assert "def reshaped(r):" in out


def test_tensors_of_an_untyped_data_set_are_typed_in_the_package(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = trainmate("refactor", NOTEBOOKS / "types_untyped_data.ipynb", "-o", out, "--no-docs")
    assert proc.returncode == 0, proc.stderr
    code = "\n".join(p.read_text() for p in (out / "types_untyped_data").glob("*.py"))
    assert re.search(r"def fit\(x: (torch\.)?Tensor, y: (torch\.)?Tensor, epochs: int = 2\)", code)
    assert re.search(r"def peek\(image: (torch\.)?Tensor\)", code)
    report = (out / "REFACTOR_REPORT.md").read_text()
    assert "mypy on the package: clean." in report


def test_an_optional_union_of_models_is_one_flat_union() -> None:
    from refactor.typeexpr import NONE, UNION, T, join

    def chain(name: str) -> list[str]:
        return [name, "torch.nn.Module"]

    a, b = T(".m.A"), T(".m.B")
    assert join([b, a, NONE], chain) == T(UNION, a, b, NONE)  # not `(A | B) | None`
    assert join([a, NONE, b], chain) == T(UNION, a, b, NONE)
