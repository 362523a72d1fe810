"""
Step 6: pytest tests for the package, in `OUT/tests/`.

Always: an import test per module. With the types recorded by `--execute`:

- each `nn.Module` built with the arguments it was built with in the notebook (when they were
  plain numbers, strings or booleans, or none were needed) runs `forward` on CPU on random inputs
  of the recorded dtypes and shapes (the batch cut to at most 4; integer tensors drawn from the
  range of values the notebook passed, one-dimensional ones longest first as lengths are), and
  the output's shape and dtype
  must be the recorded ones; then one SGD step on that batch: the loss is finite and the
  parameters change;
- each Dataset built from random tensors of the recorded shapes has the recorded `len()`, and
  its first item the recorded structure, dtypes and shapes;
- functions that took and returned small tensors, drew no random numbers and gave the same result
  twice in the notebook get characterisation tests (`characterise`): their recorded inputs (saved with
  `torch.save` in `tests/fixtures.pt`, under a size budget) must give the recorded output
  (`torch.testing.assert_close`).

A test is generated only when it can be generated soundly; `skipped` says why each one was not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import libcst as cst

from .characterise import characterisation_tests
from .plan import Plan

MODEL_BASES = re.compile(r"(^|\.)(Module|Sequential)$")
DATASET_BASES = re.compile(r"(^|\.)(Dataset)$")


@dataclass
class Generated:
    files: dict[str, str] = field(default_factory=dict)
    binary: dict[str, bytes] = field(default_factory=dict)
    tests: list[str] = field(default_factory=list)  # test names
    skipped: list[str] = field(default_factory=list)  # "what: why"


def _bases(plan: Plan, name: str) -> list[str]:
    node = plan.placed[name].item.node
    if not isinstance(node, cst.ClassDef):
        return []
    return [cst.Module([]).code_for_node(b.value) for b in node.bases]


def _literal_kwargs(call: dict[str, Any]) -> dict[str, Any] | None:
    """The recorded arguments as Python literals, or None if one was not a plain value."""
    kwargs = {}
    for name, d in call["args"].items():
        if "value" not in d:
            return None
        kwargs[name] = d["value"]
    return kwargs


def _tensor_expr(d: dict[str, Any], batch: int | None) -> str | None:
    if d.get("kind") != "tensor":
        return None
    shape = list(d["shape"])
    if batch is not None and shape:
        shape[0] = batch
    dtype = d["dtype"]
    if dtype.startswith(("float", "bfloat", "complex")):
        return f"torch.randn({tuple(shape)!r}, dtype=torch.{dtype})"
    if dtype == "bool":
        return f"torch.randint(0, 2, {tuple(shape)!r}).bool()"
    low, high = d.get("min", 0), d.get("max", 1)  # the range the notebook's values had
    drawn = f"torch.randint({low}, {high + 1}, {tuple(shape)!r}, dtype=torch.{dtype})"
    # one dimension: lengths, as `pack_padded_sequence` wants them by default (longest first)
    return f"{drawn}.sort(descending=True).values" if len(shape) == 1 else drawn


def _batch(d: dict[str, Any]) -> int | None:
    shape = d.get("shape") or []
    return min(shape[0], 4) if shape else None


def _module_tests(plan: Plan, trace: dict[str, list[dict[str, Any]]], out: Generated) -> str:
    pkg = plan.package
    lines: list[str] = []
    for name, placed in plan.placed.items():
        if name in plan.in_run or not any(MODEL_BASES.search(b) for b in _bases(plan, name)):
            continue
        inits = trace.get(f"{name}.__init__", [])
        forwards = trace.get(f"{name}.forward", [])
        if not forwards:
            out.skipped.append(f"{name}: forward never ran in the notebook")
            continue
        kwargs = _literal_kwargs(inits[0]) if inits else {}
        if kwargs is None:
            out.skipped.append(f"{name}: built from values that are not plain literals")
            continue
        call = forwards[0]
        args = list(call["args"].values())
        if not args or any(a.get("kind") != "tensor" for a in args):
            out.skipped.append(f"{name}: forward took something other than tensors")
            continue
        result = call["return"]
        if result.get("kind") != "tensor":
            out.skipped.append(f"{name}: forward did not return one tensor")
            continue
        batch = _batch(args[0])
        inputs = [_tensor_expr(a, batch) for a in args]
        expected = list(result["shape"])
        if expected and args[0]["shape"] and expected[0] == args[0]["shape"][0] and batch:
            expected[0] = batch
        built = f"{name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
        module = placed.module
        lines += [
            "",
            "",
            f"def test_{name.lower()}_forward_gives_the_recorded_shape_and_dtype() -> None:",
            "    torch.manual_seed(0)",
            f"    model = {built}",
            f"    out = model({', '.join(i for i in inputs if i)})",
            f"    assert tuple(out.shape) == {tuple(expected)!r}",
            f"    assert out.dtype == torch.{result['dtype']}",
            "",
            "",
            f"def test_{name.lower()}_one_training_step_is_finite_and_changes_the_weights() -> None:",
            "    torch.manual_seed(0)",
            f"    model = {built}",
            "    model.train()",
            "    before = [p.detach().clone() for p in model.parameters() if p.requires_grad]",
            "    if not before:",
            '        pytest.skip("no trainable parameters")',
            "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)",
            f"    loss = model({', '.join(i for i in inputs if i)}).float().pow(2).mean()",
            "    loss.backward()",
            "    optimizer.step()",
            "    assert torch.isfinite(loss)",
            "    after = [p.detach() for p in model.parameters() if p.requires_grad]",
            "    assert any(not torch.equal(a, b) for a, b in zip(before, after))",
        ]
        out.tests += [f"{name}: forward shape and dtype", f"{name}: one training step"]
        lines.insert(0, f"from {pkg}.{module} import {name}")
    if not lines:
        return ""
    imports = sorted(line for line in lines if line.startswith("from "))
    body = [line for line in lines if not line.startswith("from ")]
    return (
        '"""Models: the recorded shapes and dtypes, and one training step (generated)."""\n\n'
        "from __future__ import annotations\n\nimport pytest\nimport torch\n\n"
        + "\n".join(imports)
        + "\n"
        + "\n".join(body)
        + "\n"
    )


def _dataset_tests(plan: Plan, trace: dict[str, list[dict[str, Any]]], out: Generated) -> str:
    pkg = plan.package
    lines: list[str] = []
    imports: list[str] = []
    for name, placed in plan.placed.items():
        if name in plan.in_run or not any(DATASET_BASES.search(b) for b in _bases(plan, name)):
            continue
        inits = trace.get(f"{name}.__init__", [])
        lens = trace.get(f"{name}.__len__", [])
        items = trace.get(f"{name}.__getitem__", [])
        if not inits or not lens or not items:
            out.skipped.append(f"{name}: not built, measured and indexed in the notebook")
            continue
        arguments: list[str] = []
        length = item = None
        for init in inits:  # the first construction made of tensors and literals only
            arguments = []
            same = init.get("instance")
            length = next(
                (c["return"].get("value") for c in lens if c.get("instance") == same), None
            )
            item = next((c["return"] for c in items if c.get("instance") == same), None)
            if length is None or item is None:
                continue
            for arg, d in init["args"].items():
                if d.get("kind") == "tensor":
                    arguments.append(f"{arg}={_tensor_expr(d, None)}")
                elif "value" in d or d.get("type") in ("NoneType", "builtins.NoneType"):
                    arguments.append(f"{arg}={d.get('value')!r}")
                else:
                    arguments = []
                    break
            if arguments:
                break
        if not arguments or length is None or item is None:
            out.skipped.append(f"{name}: built from something other than tensors and literals")
            continue
        checks = _structure_checks("item", item)
        if checks is None:
            out.skipped.append(f"{name}: its items hold something other than tensors")
            continue
        imports.append(f"from {pkg}.{placed.module} import {name}")
        lines += [
            "",
            "",
            f"def test_{name.lower()}_length_and_first_item() -> None:",
            "    torch.manual_seed(0)",
            f"    dataset = {name}({', '.join(arguments)})",
            f"    assert len(dataset) == {length!r}",
            "    item = dataset[0]",
            *[f"    {c}" for c in checks],
        ]
        out.tests.append(f"{name}: len() and the first item's structure")
    if not lines:
        return ""
    return (
        '"""Datasets: length and item structure on random data of the recorded shapes (generated)."""\n\n'
        "from __future__ import annotations\n\nimport torch\n\n"
        + "\n".join(sorted(imports))
        + "\n"
        + "\n".join(lines)
        + "\n"
    )


def _structure_checks(expr: str, d: dict[str, Any]) -> list[str] | None:
    if d.get("kind") == "tensor":
        shape = tuple(d["shape"])
        return [
            f"assert isinstance({expr}, torch.Tensor)",
            f"assert tuple({expr}.shape) == {shape!r}",
            f"assert {expr}.dtype == torch.{d['dtype']}",
        ]
    if d.get("kind") == "tuple":
        checks = [f"assert len({expr}) == {len(d['items'])}"]
        for i, sub in enumerate(d["items"]):
            more = _structure_checks(f"{expr}[{i}]", sub)
            if more is None:
                return None
            checks += more
        return checks
    return None


def generate(
    plan: Plan,
    trace: dict[str, list[dict[str, Any]]] | None,
    fixtures: dict[str, Any] | None,
    dropped: dict[str, str] | None = None,
) -> Generated:
    out = Generated()
    pkg = plan.package
    modules = sorted({p.module for n, p in plan.placed.items() if n not in plan.in_run})
    modules = sorted(set(modules) | {"config", "train"})
    out.files["tests/test_import.py"] = (
        '"""Every module imports, and importing runs nothing (generated)."""\n\n'
        "from __future__ import annotations\n\nimport importlib\n\nimport pytest\n\n\n"
        f'@pytest.mark.parametrize("module", {modules!r})\n'
        "def test_module_imports(module: str) -> None:\n"
        f'    importlib.import_module(f"{pkg}.{{module}}")\n'
    )
    out.tests.append(f"import of {len(modules)} modules")
    if trace is None:
        out.skipped.append("model, dataset and characterisation tests: need --execute")
        return out
    for path, text in (
        ("tests/test_models.py", _module_tests(plan, trace, out)),
        ("tests/test_datasets.py", _dataset_tests(plan, trace, out)),
        (
            "tests/test_characterisation.py",
            characterisation_tests(plan, fixtures or {}, out, trace, dropped or {}),
        ),
    ):
        if text:
            out.files[path] = text
    return out
