"""
Step 4d: the files around the code: `pyproject.toml` (the distributions of the imports the
modules use and the notebook's `pip install`s), `README.md` (with the notebook's recorded runs),
and `PKG/__main__.py` from its template (`templates/main.py.tmpl`, package data).
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
import sys
import textwrap
from collections.abc import Iterable, Mapping
from importlib.resources import files as package_files
from pathlib import Path
from string import Template

from jupyter_trainmate.runs_table import END, START, markdown_table
from jupyter_trainmate.runtime.records import read_records

from .plan import Plan

DISTRIBUTIONS = {
    "sklearn": "scikit-learn",
    "PIL": "pillow",
    "cv2": "opencv-python",
    "yaml": "pyyaml",
    "skimage": "scikit-image",
    "bs4": "beautifulsoup4",
    "attr": "attrs",
    "dateutil": "python-dateutil",
    "jupyter_trainmate": "jupyter_trainmate",
    "IPython": "ipython",
    "torch": "torch",
    "mpl_toolkits": "matplotlib",
}


LAUNCH = """\
    from .train import run

    run(Config(**values))
"""

# with `PKG/distributed.py`: the training joins torchrun's process group when there is one; its
# exceptions go to torchrun's error file (`record`): the launcher shows the failing rank's traceback
BACKEND_OPTION = """\
    train.add_argument(
        "--dist-backend",
        default="auto",
        choices=("auto", "nccl", "gloo"),
        help="under torchrun: the process group's backend (auto: nccl with GPUs, else gloo)",
    )
"""
LAUNCH_DISTRIBUTED = """\
    from torch.distributed.elastic.multiprocessing.errors import record

    from . import distributed

    @record
    def train(config: Config) -> None:
        distributed.setup(args.dist_backend)  # nothing without torchrun
        try:
            from .train import run

            run(config)
        finally:
            distributed.teardown()

    train(Config(**values))
"""


# a `%%train --sweep N` cell: `python -m PKG sweep --trials N` runs its study (sweep/function.py)
SWEEP_COMMAND = """\
    sweep = commands.add_parser(
        "sweep", help="the notebook's %%train --sweep: trials of its study (runs/optuna.journal)"
    )
    sweep.add_argument("--trials", type=int, default=$trials, help="default: $trials (the cell's)")
    sweep.add_argument(
        "--parallel", type=int, default=None, help="K trials at a time in K worker processes"
    )
"""
SWEEP_LAUNCH = """\
    if args.command == "sweep":
        from jupyter_trainmate.sweep.function import sweep_trials

        from .train import run

        with sweep_trials(args.trials, args.parallel):  # ends after the study
            run(Config(**values))
        return 0
    from jupyter_trainmate.sweep.function import no_sweep

    with no_sweep():  # one run: each suggest() gives its default
"""


def sweep_default(options: Iterable[str]) -> int | None:
    """The `--sweep N` of the first `%%train` cell that has one (None: no sweep cell)."""
    from jupyter_trainmate.errors import TrainmateError
    from jupyter_trainmate.runtime.options import HelpShown, parse_options

    for line in options:
        try:
            trials = parse_options(line).sweep
        except (TrainmateError, HelpShown):
            continue
        if trials is not None:
            return trials
    return None


def _template(name: str) -> Template:
    path = package_files(__package__ or "refactor").joinpath("templates", name)
    return Template(path.read_text(encoding="utf-8"))


def main_module(
    package: str, title: str, distributed: bool = False, sweep: int | None = None
) -> str:
    """`PKG/__main__.py`: the CLI, one option per `Config` field (and `--dist-backend` when the
    package has `distributed.py`; a `sweep` command when a cell was `%%train --sweep N`)."""
    launch = LAUNCH_DISTRIBUTED if distributed else LAUNCH
    if sweep is not None:
        launch = SWEEP_LAUNCH + textwrap.indent(launch, "    ")
    return _template("main.py.tmpl").substitute(
        package=package,
        title=repr(title),
        options=BACKEND_OPTION if distributed else "",
        train="train = " if distributed else "",  # named only where an option is added to it
        launch=launch,
        sweep=Template(SWEEP_COMMAND).substitute(trials=sweep) if sweep is not None else "",
        sweep_doc=", `sweep`" if sweep is not None else "",
    )


def distributed_module(package: str) -> str:
    """`PKG/distributed.py`: rank, device, sharded loaders and DDP for `torchrun`."""
    return _template("distributed.py.tmpl").substitute(package=package)


def sbatch_script(package: str) -> str:
    """`train.sbatch`: `srun torchrun ...` on a Slurm cluster (the README says how)."""
    return _template("train.sbatch.tmpl").substitute(package=package)


def _torchrun(pkg: str) -> str:
    """The README's section on data-parallel training under `torchrun`."""
    return f"""
## On several GPUs and machines

`python -m {pkg} train` runs data-parallel under `torchrun` (one process per GPU): each
process trains on its share of every `DataLoader` (a `DistributedSampler`) with the model in
`DistributedDataParallel`; rank 0 alone prints, evaluates and saves (`{pkg}/distributed.py`,
called from `run()` in `{pkg}/train.py`). The batch size is per process: the global batch is
`--batch-size` times the number of processes. Without `torchrun` it runs in one process as above.

```console
# one machine, 8 GPUs
torchrun --standalone --nproc-per-node 8 -m {pkg} train
# two machines with 8 GPUs each: run this on both (HOST: the first one's address)
torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 -m {pkg} train
# a Slurm cluster: edit the #SBATCH lines of train.sbatch (nodes, GPUs per node), then
sbatch train.sbatch --epochs 10
```

NCCL on GPUs, gloo on CPUs (`--dist-backend gloo` to choose). A failing process stops the others
and `torchrun` shows its traceback.
"""


def _distribution(module: str, installed: Mapping[str, list[str]]) -> str:
    if module in DISTRIBUTIONS:
        return DISTRIBUTIONS[module]
    found = installed.get(module)
    return sorted(found)[0] if found else module


IMPORTED = re.compile(r"^\s*(?:from|import)\s+([A-Za-z_]\w*)", re.M)


SYS_PATH = re.compile(
    r"""\bsys\.path\.(?:append|insert)\(\s*(?:[-\w]+\s*,\s*)?(?:r?(['"])(.*?)\1)?"""
)


@functools.cache
def _installed() -> Mapping[str, list[str]]:
    """The installed distributions by the top-level modules they provide, read once a process
    (a scan of every distribution's file list: about 0.2 s, and the pyproject, the local
    modules and the report each ask)."""
    return importlib.metadata.packages_distributions()


def local_modules(plan: Plan, files: Mapping[str, str]) -> list[str]:
    """Modules the package imports that are the notebook's own files beside it (`vocab.py`, a
    `utils/` folder of its repository) and no installed distribution: no index has them (a
    dependency of that name installs an unrelated package, or nothing). Beside it, or in a
    folder the notebook puts on `sys.path` (`sys.path.append("../")`); and, where that folder
    is not there to look in, a module the notebook imports right after such a line, in the
    same cell (`sys.path.append("../")`, then `from cm_utils import ...`)."""
    folder = plan.notebook.path.parent
    code = "\n".join(t for p, t in files.items() if p.endswith(".py"))
    bases = [folder]
    after: set[str] = set()  # imported in a cell after its `sys.path` line
    for cell in plan.notebook.cells:
        found = list(SYS_PATH.finditer(cell.python))
        if not found:
            continue
        bases += [folder / m[2] for m in found if m[2] and not Path(m[2]).is_absolute()]
        after.update(IMPORTED.findall(cell.python[found[0].end() :]))
    beside = [
        top
        for top in set(IMPORTED.findall(code)) - {plan.package}
        if top not in DISTRIBUTIONS
        and top not in sys.stdlib_module_names
        and (
            top in after
            or any(
                (b / f"{top}.py").is_file() or (b / top / "__init__.py").is_file() for b in bases
            )
        )
    ]
    if not beside:  # the usual case: no scan of the installed distributions (about 0.2 s)
        return []
    return sorted(top for top in beside if top not in _installed())


def pyproject(plan: Plan, import_lines: Iterable[str], files: Mapping[str, str]) -> str:
    installed = _installed()
    requirements: dict[str, str] = {}
    code = "\n".join(t for p, t in files.items() if p.endswith(".py"))
    local = set(local_modules(plan, files))
    for line in import_lines:
        if line not in code:
            continue
        words = line.split()
        top = words[1].split(".")[0]
        if top in sys.stdlib_module_names or top == "__future__" or words[1].startswith("."):
            continue
        if top in local:
            continue  # the report says how to bring it along
        dist = _distribution(top, installed)
        requirements.setdefault(dist.lower().replace("_", "-"), dist)
    for requirement in plan.notebook.dependencies:
        name = requirement.split("[")[0]
        for sep in "=<>!~ ;":
            name = name.split(sep)[0]
        requirements[name.lower().replace("_", "-")] = requirement
    deps = "".join(f'    "{r}",\n' for _, r in sorted(requirements.items()))
    return f'''[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{plan.package}"
version = "0.1.0"
description = "The notebook {plan.notebook.path.name} as a package (generated by trainmate refactor)"
readme = "README.md"
requires-python = ">=3.10"
dependencies = [
{deps}]

[project.scripts]
{plan.package} = "{plan.package}.__main__:main"

[tool.setuptools]
packages = ["{plan.package}"]

[project.optional-dependencies]
test = ["pytest"]

[tool.pytest.ini_options]
pythonpath = ["."]
testpaths = ["tests"]

[tool.mypy]
# a function whose own code fails mypy is `@no_type_check`, or, a method that sets attributes,
# left without annotations (REFACTOR_REPORT.md says which and why)
ignore_missing_imports = true
# a notebook rebinds names to new types (`x = np.linspace(...)`, later `x = torch.ones(...)`)
allow_redefinition = true

[tool.ruff.lint]
# pycodestyle errors, pyflakes and import order: the checks `trainmate refactor` guarantees
select = ["E4", "E7", "E9", "F", "I"]
'''


def readme(plan: Plan, title: str, plots: str | None, distributed: bool = False) -> str:
    pkg = plan.package
    modules = sorted({p.module for p in plan.placed.values()} | {"config", "train"})
    rows = "".join(
        f"| `{pkg}.{m}` | "
        f"{', '.join(sorted(n for n, p in plan.placed.items() if p.module == m)) or '-'} |\n"
        for m in modules
    )
    shown = (
        f"python -m {pkg} train --{plots.replace('_', '-')}   # and the notebook's plots and prints\n"
        if plots
        else ""
    )
    return f"""# {title}

The notebook `{plan.notebook.path.name}` as an installable package, written by `trainmate refactor`.
What went where, and what was left out and why: `REFACTOR_REPORT.md`.

```console
pip install -e .
python -m {pkg} train --help
python -m {pkg} train            # the notebook's training, with its hyperparameters
{shown}```

| module | definitions |
| --- | --- |
{rows}{_torchrun(pkg) if distributed else ""}{_experiments(plan)}"""


def _experiments(plan: Plan) -> str:
    """The notebook's recorded runs, between the markers `trainmate runs --markdown` keeps."""
    records = read_records(plan.notebook.path.parent / "runs")
    if not records:
        return ""
    return (
        "\n## Experiments\n\nThe notebook's `%%train` runs (`trainmate runs --markdown README.md`"
        f" updates this table):\n\n{START}\n{markdown_table(records[-10:])}\n{END}\n"
    )
