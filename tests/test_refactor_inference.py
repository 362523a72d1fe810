"""Static types where a section function rebinds a name (`model = model.to(device)` in a later
section): the argument a call passes is typed by the binding that reaches it when the function's
top level makes that certain (`refactor/reaching.py`), and by nothing else where a loop or a
branch may rebind it. Small sources, no notebook run, no mypy (`tests/test_refactor_types.py`
has the helper)."""

from __future__ import annotations

import textwrap

from refactor.annotate import annotate
from tests.test_refactor_types import HEADER, formatted, typed


def signatures(code: str) -> list[str]:
    return [line for line in code.splitlines() if line.startswith("def ")]


def test_a_name_rebound_by_a_call_types_the_calls_before_and_after_it() -> None:
    out = typed(
        train="""
        import torch
        from torch import nn

        class Net(nn.Module):
            def forward(self, x):
                return x

        def build():
            model = Net()
            return model

        def to_device(model, criterion, device):
            model = model.to(device)
            criterion = criterion.to(device)
            return model, criterion

        def show(model):
            print(model)

        def run():
            device = torch.device("cpu")
            model = build()
            criterion = nn.CrossEntropyLoss()
            show(model)
            model, criterion = to_device(model, criterion, device)
            show(model)
            return model
        """
    )["train"]
    assert signatures(out) == [
        "def build() -> Net:",
        "def to_device(model: Net, criterion: nn.CrossEntropyLoss, device: torch.device)"
        " -> tuple[Net, nn.CrossEntropyLoss]:",
        "def show(model: Net) -> None:",
        "def run() -> Net:",
    ]


def test_the_statements_before_a_branch_reach_into_it_and_a_value_reads_names_there() -> None:
    """`run()` puts the sections after the model's wrapping under `if distributed.is_main():`
    (and display under `if config.plots:`): the statements before the `if` and those before the
    point in its branch ran, in order. And a value that reads the name it rebinds (`model =
    model.to(device)`, `distributed.wrap(model)`) is typed with that name where it stands: a
    later `model = json.loads(...)` left `model` untyped there (MIT 6.5940's labs, whose
    sections then lost every `model` annotation)."""
    out = typed(
        train="""
        import json
        import torch
        from torch import nn

        class Net(nn.Module):
            def forward(self, x):
                return x

        def build():
            return Net()

        def show(model):
            print(model)

        def after(model):
            print(model)

        def other(model):
            print(model)

        def run(flag):
            device = torch.device("cpu")
            model = build()
            model = model.to(device)
            if flag:
                show(model)
                model = json.loads("{}")
                other(model)
            else:
                after(model)
            model = json.loads("{}")
            return model
        """
    )["train"]
    assert signatures(out)[1:4] == [
        "def show(model: Net) -> None:",
        "def after(model: Net) -> None:",
        "def other(model) -> None:",
    ]


def test_a_parameter_rebound_later_is_the_parameter_before_it() -> None:
    out = typed(
        train="""
        def width(n):
            return n * 2

        def scale(size):
            doubled = width(size)
            size = str(size)
            return doubled, size

        def run():
            return scale(3)
        """
    )["train"]
    assert "def width(n: int) -> int:" in out
    assert "def scale(size: int) -> tuple[int, str]:" in out


def test_a_loop_or_a_branch_that_may_rebind_the_name_leaves_it_untyped() -> None:
    out = typed(
        train="""
        def first(value):
            print(value)

        def second(value):
            print(value)

        def third(value):
            print(value)

        def run(flag):
            x = 1
            for _ in range(3):
                first(x)
                x = "a"
            y = 1
            if flag:
                y = "b"
            second(y)
            z = 1.0
            with open("f") as z:
                pass
            third(z)
        """
    )["train"]
    assert signatures(out)[:3] == [
        "def first(value) -> None:",
        "def second(value) -> None:",
        "def third(value) -> None:",
    ]


def test_a_literal_default_types_a_parameter_callers_pass_unknown_values_to() -> None:
    out = typed(
        train="""
        import json

        def load():
            return json.loads("[1]")

        def fit(data, epochs=3, lr=0.1, name="run", flag=None, size=2):
            print(data, epochs, lr, name, flag, size)

        def run():
            data = load()
            fit(data, epochs=data, lr=0.5, size="two")
        """
    )["train"]
    # `epochs` gets an unknown value and keeps its default's type; `lr` the join with 0.5;
    # `flag=None` says nothing; `size` gets a str where its default is an int: no type
    assert (
        'def fit(data, epochs: int = 3, lr: float = 0.1, name: str = "run", flag=None, size=2)'
        in out
    )


def test_a_parameter_used_through_a_tensor_only_method_is_a_tensor() -> None:
    out = typed(
        train="""
        import json

        def load():
            return json.loads("[1]")

        def to_batch(x, y):
            return x.unsqueeze(0).detach(), y

        def rebound(x):
            x = list(x)
            return x.unsqueeze(0)

        def other(x):
            return x.detach()

        def run():
            to_batch(load(), 1)
            rebound(load())
            other("s")
        """
    )["train"]
    assert "def to_batch(x: Tensor, y: int) -> tuple[Tensor, int]:" in out
    assert "def rebound(x)" in out  # rebound first: the method is called on another value
    assert "def other(x: str)" in out  # a caller's known type decides (mypy then rejects it)


def test_the_new_annotations_pass_mypy() -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/train.py": HEADER
        + textwrap.dedent(
            """
            import json

            import torch
            import torch.nn.functional as F

            def load():
                return json.loads("[1]")

            def fit(data, epochs=3, lr=0.1):
                for _ in range(epochs):
                    print(data, lr * 2)

            def first(x):
                return x.unsqueeze(0)

            def loss_of(pred, seed):
                torch.manual_seed(seed)
                return F.mse_loss(pred, pred)

            def run():
                data = load()
                fit(data, epochs=data)
                first(torch.zeros(2))
                first(load())
                loss_of(load(), load())
            """
        ),
    }
    result = annotate(files, "pkg")
    code = formatted(result.files["pkg/train.py"])
    assert result.checked.result == "clean", result.checked
    assert "def fit(data, epochs: int = 3, lr: float = 0.1) -> None:" in code
    assert "def first(x: torch.Tensor) -> torch.Tensor:" in code
    assert "def loss_of(pred: torch.Tensor, seed: int) -> torch.Tensor:" in code
    assert "no_type_check" not in code


def test_a_parameter_handed_as_it_is_to_a_torch_function_has_the_type_it_must_have() -> None:
    out = typed(
        train="""
        import json

        import torch
        import torch.nn.functional as F

        def load():
            return json.loads("[1]")

        def set_seed(seed):
            torch.manual_seed(seed)

        def loss_of(pred, y, w):
            return F.mse_loss(pred, y) + torch.exp(w).sum()

        def stacked(parts):
            return torch.cat(parts)

        def run():
            set_seed(load())
            loss_of(load(), load(), load())
            stacked(load())
        """
    )["train"]
    assert "def set_seed(seed: int) -> None:" in out
    assert (
        "def loss_of(pred: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:" in out
    )
    assert "def stacked(parts) -> torch.Tensor:" in out  # a sequence of tensors: not typed here


def test_a_name_a_branch_or_loop_updates_keeps_the_type_the_update_keeps() -> None:
    out = typed(
        train="""
        import torch

        def normalized(rewards, normalize=True):
            returns = []
            for r in reversed(rewards):
                returns.insert(0, r)
            returns = torch.tensor(returns)
            if normalize:
                returns = (returns - returns.mean()) / returns.std()
            return returns

        def counted(n):
            total = 0
            for i in range(n):
                total += i
            return total

        def changed(flag):
            value = 1
            if flag:
                value = str(value)
            return value

        def halved(x):
            if x.dim() > 1:
                x = x.mean(0)
            return x

        def run():
            halved(torch.zeros(2, 2))
            return normalized([1.0]), counted(3), changed(True)
        """
    )["train"]
    assert "def normalized(rewards: list[float], normalize: bool = True) -> torch.Tensor:" in out
    assert "def counted(n: int) -> int:" in out
    assert "def changed(flag: bool):" in out  # the update gives a str: no type
    assert (
        "def halved(x: torch.Tensor) -> torch.Tensor:" in out
    )  # a parameter updated in a branch (typed before too)


def test_more_torch_functions_and_tensor_methods_give_tensors() -> None:
    out = typed(
        train="""
        import torch

        def score(a, b):
            return torch.dot(a.view(-1), b.view(-1))

        def spread(x):
            return torch.std(x), x.square().amax()

        def run():
            return score(torch.zeros(2), torch.ones(2)), spread(torch.ones(3))
        """
    )["train"]
    assert "def score(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:" in out
    assert "def spread(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:" in out


def test_a_starred_tuple_of_known_length_types_the_parameters_it_fills() -> None:
    out = typed(
        train="""
        import torch

        def fold(x, y):
            return x[:2], y[:2], x[2:], y[2:]

        def fit(net, x_train, y_train, x_valid, y_valid, epochs):
            print(net, x_train, y_train, x_valid, y_valid, epochs)

        def unknown(a, b):
            print(a, b)

        def run(items):
            data = fold(torch.zeros(4), torch.ones(4))
            fit("net", *data, 3)
            unknown(*items)
        """
    )["train"]
    assert (
        "def fit(net: str, x_train: torch.Tensor, y_train: torch.Tensor, x_valid: torch.Tensor,"
        " y_valid: torch.Tensor, epochs: int) -> None:" in " ".join(out.split()).replace("( ", "(")
    )
    assert "def unknown(a, b) -> None:" in out  # a starred value of unknown length


def test_the_updated_and_spread_types_pass_mypy() -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/train.py": HEADER
        + textwrap.dedent(
            """
            import torch

            def returns_of(rewards, normalize=True):
                returns = []
                for r in reversed(rewards):
                    returns.insert(0, r)
                returns = torch.tensor(returns)
                if normalize:
                    returns = (returns - returns.mean()) / returns.std()
                return returns

            def fold(x, y):
                return x[:2], y[:2], x[2:], y[2:]

            def fit(x_train, y_train, x_valid, y_valid, epochs):
                for _ in range(epochs):
                    print(torch.dot(x_train, y_train) - torch.dot(x_valid, y_valid))

            def run():
                data = fold(returns_of([1.0, 2.0, 3.0, 4.0]), torch.ones(4))
                fit(*data, 3)
            """
        ),
    }
    result = annotate(files, "pkg")
    code = formatted(result.files["pkg/train.py"])
    assert result.checked.result == "clean", result.checked
    flat = " ".join(code.split())
    # `returns = []`, then a tensor: mypy asks the list's type, and a list type would fail on
    # the tensor line (as in the notebooks it comes from); it is `Any`, and the function stays
    # checked (it was `@no_type_check`); its return type types its callers
    assert "def returns_of(rewards: list[float], normalize: bool = True)" in flat
    assert "returns: Any = []" in flat
    assert "normalize: bool = True) -> torch.Tensor:" in flat
    assert "x_train: torch.Tensor," in flat
    assert "epochs: int" in flat
    assert flat.count("@no_type_check") == 0


def test_a_torch_dtype_attribute_is_a_dtype() -> None:
    """`dtype = torch.float32`, passed on (cs231n's PyTorch assignment: 24 parameters)."""
    out = typed(
        train="""
        import torch

        def make(dtype):
            return torch.zeros(2, dtype=dtype)

        def run():
            dtype = torch.float32
            return make(dtype), make(torch.long)
        """
    )["train"]
    assert signatures(out)[0] == "def make(dtype: torch.dtype) -> torch.Tensor:"
