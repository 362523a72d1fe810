"""`trainmate refactor` writes packages that train data-parallel under `torchrun`: the same final
weights with 2 processes of batch B as with one process of batch 2B, output and checkpoints from
rank 0 only, and one process without `torchrun` exactly as before."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from jupyter_trainmate.refactor.distribute import kind

NOTEBOOKS = Path(__file__).parent / "notebooks"
PACKAGE = "ddp_mlp"


def refactored(name: str, out: Path, *args: str) -> Path:
    proc = subprocess.run(
        [sys.executable, "-m", "jupyter_trainmate", "refactor", NOTEBOOKS / f"{name}.ipynb",
         "-o", str(out), *args],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return refactored(PACKAGE, tmp_path_factory.mktemp("ddp") / PACKAGE)


def python_env(package: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join([str(package), env.get("PYTHONPATH", "")])
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_kind_tells_loaders_and_models_from_the_rest() -> None:
    assert kind("loader = DataLoader(ds, batch_size=8)", "loader", set()) == "shard"
    assert kind("dl = torch.utils.data.DataLoader(ds)", "dl", set()) == "shard"
    assert kind("model = Net(4).to(device)", "model", {"Net"}) == "wrap"
    assert kind("model = nn.Sequential(nn.Linear(2, 2))", "model", set()) == "wrap"
    assert kind("model = resnet18(weights=None).to(device)", "model", set()) == "wrap"
    assert kind("loss_fn = nn.CrossEntropyLoss()", "loss_fn", set()) is None
    assert kind("x = x.to(device)", "x", set()) is None  # a tensor moved, not a model built
    assert kind("opt = make_optimizer(model)", "opt", set()) is None
    assert kind("a, b = DataLoader(ds), 1", "a", set()) is None


def test_run_shards_the_loader_wraps_the_model_and_saves_on_rank_0(package: Path) -> None:
    train = (package / PACKAGE / "train.py").read_text()
    run = train[train.index("def run(") :]
    lines = [line.strip() for line in run.splitlines()]
    shard, wrap = (
        lines.index("loader = distributed.shard(loader)"),
        lines.index("model = distributed.wrap(model)"),
    )
    training = next(i for i, line in enumerate(lines) if line.startswith("history = train("))
    main = lines.index("if distributed.is_main():  # evaluation, saving, display: once, on rank 0")
    saving = next(i for i, line in enumerate(lines) if line.startswith("save_model("))
    assert shard < training
    assert wrap < training < main < saving
    assert lines.index("model = distributed.unwrap(model)") < main
    device = lines.index("device = resolve_device(config.device)")
    assert lines[device + 1].startswith("device = distributed.device(device)")
    assert "from . import distributed" in train
    main_py = (package / PACKAGE / "__main__.py").read_text()
    assert "@record" in main_py
    assert "distributed.teardown()" in main_py
    assert "--dist-backend" in main_py
    readme = (package / "README.md").read_text()
    assert f"torchrun --standalone --nproc-per-node 8 -m {PACKAGE} train" in readme
    assert (
        f"torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d "
        f"--rdzv-endpoint HOST:29500 -m {PACKAGE} train"
    ) in readme
    sbatch = package / "train.sbatch"
    assert f"-m {PACKAGE} train" in sbatch.read_text()
    assert "srun torchrun" in sbatch.read_text()
    checked = subprocess.run(["bash", "-n", sbatch], capture_output=True, text=True, check=False)
    assert (checked.returncode, checked.stderr) == (0, "")
    report = (package / "REFACTOR_REPORT.md").read_text()
    assert "mypy on the package: clean." in report
    assert "`ruff check`: clean" in report


def test_a_notebook_with_a_train_cell_wires_the_model_it_builds(tmp_path: Path) -> None:
    out = refactored("realistic_training", tmp_path / "rt", "--no-docs", "--skip-bad-cells")
    train = (out / "realistic_training" / "train.py").read_text()
    cell = train[train.index("def train_cell_") : train.index("def set_up(")]
    built = cell.index("model2 = SmallNet(")
    assert built < cell.index("model2 = distributed.wrap(model2)") < cell.index("make_optimizer(")
    run = train[train.index("def run(") :]
    for line in (
        "train_loader = distributed.shard(train_loader)",
        "valid_loader = distributed.shard(valid_loader)",
        "model = distributed.wrap(model)",
        "baseline = distributed.wrap(baseline)",
    ):
        assert line in run
    assert run.index("second_schedule_train(") < run.index("if distributed.is_main():")
    assert run.index("if distributed.is_main():") < run.index("save_model(")


def test_without_torchrun_every_call_is_a_no_op(package: Path) -> None:
    script = textwrap.dedent(
        """
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        from ddp_mlp import distributed

        loader = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=2, shuffle=True)
        model = torch.nn.Linear(2, 2)
        distributed.setup()
        assert not torch.distributed.is_initialized()
        assert distributed.shard(loader) is loader
        assert distributed.wrap(model) is model and distributed.unwrap(model) is model
        assert distributed.device(torch.device("cpu")) == torch.device("cpu")
        assert distributed.is_main() and distributed.world_size() == 1
        distributed.teardown()
        print("no-op")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env=python_env(package), capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "no-op\n", "")


def test_shard_and_wrap_in_a_process_group(package: Path) -> None:
    """One rank of a gloo group: the loader keeps its shuffle and seed and reshuffles each
    epoch; the wrapped model reads and saves like the model; a loader with its own sampler is
    refused in one line."""
    script = textwrap.dedent(
        """
        import torch
        from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
        from ddp_mlp import distributed

        distributed.setup("gloo")
        ds = TensorDataset(torch.arange(16.0))
        g = torch.Generator().manual_seed(7)
        sharded = distributed.shard(DataLoader(ds, batch_size=4, shuffle=True, generator=g))
        sampler = sharded.sampler
        assert isinstance(sampler, DistributedSampler)
        assert sampler.shuffle and sampler.seed == 7
        first = [b[0].tolist() for b in sharded]
        second = [b[0].tolist() for b in sharded]
        assert sorted(sum(first, [])) == sorted(sum(second, [])) == list(range(16))
        assert first != second  # set_epoch: a new order each epoch
        plain = distributed.shard(DataLoader(ds, batch_size=4))
        assert [b[0].tolist() for b in plain][0] == [0.0, 1.0, 2.0, 3.0]
        model = torch.nn.Sequential(torch.nn.Linear(2, 3))
        model.classes = ("a", "b", "c")
        wrapped = distributed.wrap(model)
        assert isinstance(wrapped, torch.nn.parallel.DistributedDataParallel)
        assert list(wrapped.state_dict()) == list(model.state_dict()) == ["0.weight", "0.bias"]
        assert wrapped.classes == ("a", "b", "c")  # the model's own attributes
        assert wrapped.append == model.append
        assert distributed.unwrap(wrapped) is model
        assert distributed.wrap(torch.nn.MSELoss()) is not None
        odd = DataLoader(ds, sampler=list(range(16)))
        try:
            distributed.shard(odd)
        except SystemExit as refused:
            print(refused)
        distributed.teardown()
        """
    )
    env = python_env(package)
    env.update(
        WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
    )  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("distributed.shard: a DataLoader with its own sampler")
    assert len(proc.stdout.strip().splitlines()) == 1


def train_once(package: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", PACKAGE, "train", *args],
        cwd=cwd, env=python_env(package), capture_output=True, text=True, check=False,
        timeout=300,
    )  # fmt: skip


def torchrun(package: Path, cwd: Path, procs: int, *args: str) -> subprocess.CompletedProcess[str]:
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    run += ["--nproc-per-node", str(procs), "--log-dir", "logs", "--redirects", "3"]
    env = python_env(package)
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(
        [*run, "-m", PACKAGE, "train", *args],
        cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip


def ranks_said(logs: Path) -> str:
    """Each rank's own stderr (`--redirects 3` keeps it out of the launcher's)."""
    said = [f"rank {p.parent.name}: {p.read_text()[-1500:]}" for p in logs.rglob("stderr.log")]
    return "\n".join(sorted(said)) + "\n"


@pytest.mark.slow
def test_two_processes_under_torchrun_end_where_one_process_does(
    package: Path, tmp_path: Path
) -> None:
    """2 ranks of batch 16, unshuffled (DistributedSampler: rank r takes samples r, r+2, ...),
    against 1 process of batch 32 in the plain order: every step sees the same 32 samples and
    DDP averages the two ranks' mean gradients, so the weights agree up to summation order."""
    import torch

    cpu = ("--device", "cpu")
    one = train_once(package, tmp_path, "--batch-size", "32", "--checkpoint", "one.pt", *cpu)
    assert one.returncode == 0, one.stderr[-2000:]
    assert one.stdout.count("epoch 2: loss") == 1
    two = torchrun(package, tmp_path, 2, "--batch-size", "16", "--checkpoint", "two.pt", *cpu)
    assert two.returncode == 0, ranks_said(tmp_path / "logs") + two.stderr[-2000:]
    single = torch.load(tmp_path / "one.pt", weights_only=True)
    parallel = torch.load(tmp_path / "two.pt", weights_only=True)
    assert list(parallel) == list(single)  # the model's own keys: no `module.` prefix
    for key in single:
        torch.testing.assert_close(parallel[key], single[key], rtol=1e-5, atol=1e-6)
    logs = {p.parent.name: p.read_text() for p in (tmp_path / "logs").rglob("stdout.log")}
    assert sorted(logs) == ["0", "1"]
    assert logs["0"].count("epoch 2: loss") == 1  # rank 0 prints
    assert logs["1"] == ""  # rank 1 prints nothing
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == ["one.pt", "two.pt"]


@pytest.mark.gpu
@pytest.mark.slow
def test_nccl_under_torchrun_on_the_gpus(package: Path, tmp_path: Path) -> None:
    """NCCL with every visible GPU (one rank on a one-GPU machine): the same weights as one
    process with the global batch."""
    import torch

    gpus = torch.cuda.device_count()
    procs = 2 if gpus >= 2 else 1
    batch = ("--batch-size", str(16 * procs), "--device", "cuda")
    one = train_once(package, tmp_path, *batch, "--checkpoint", "one.pt")
    assert one.returncode == 0, one.stderr[-2000:]
    per_rank = ("--batch-size", "16", "--device", "cuda", "--dist-backend", "nccl")
    two = torchrun(package, tmp_path, procs, *per_rank, "--checkpoint", "n.pt")
    assert two.returncode == 0, (two.stdout + two.stderr)[-3000:]
    single = torch.load(tmp_path / "one.pt", map_location="cpu", weights_only=True)
    parallel = torch.load(tmp_path / "n.pt", map_location="cpu", weights_only=True)
    for key in single:
        torch.testing.assert_close(parallel[key], single[key], rtol=1e-4, atol=1e-5)


def test_train_under_torchrun_writes_record_and_checkpoints_on_rank_zero_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refactored package's `%%train` cell runs through `train()` on every rank: rank 0 alone
    writes the run record and checkpoints (the others would write the same files twice)."""
    import torch
    import torch.distributed as dist

    import jupyter_trainmate
    from jupyter_trainmate import runner

    def fit(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: list[Any]) -> None:
        for xb in loader:
            optimizer.zero_grad()
            model(xb).sum().backward()
            optimizer.step()

    def run(rank: int) -> tuple[bool, bool]:
        monkeypatch.setattr(dist, "is_initialized", lambda: True)
        monkeypatch.setattr(dist, "get_rank", lambda group=None: rank)
        folder = tmp_path / f"rank{rank}"
        folder.mkdir()
        monkeypatch.chdir(folder)
        model = torch.nn.Linear(4, 1)
        jupyter_trainmate.train(
            fit,
            "--display off --tensorboard off",
            model=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            loader=[torch.ones(2, 4)] * 3,
        )
        session = SimpleNamespace(checkpoints=SimpleNamespace(writes=True))
        hooks = runner._rank_hooks()
        if hooks is not None and hooks.on_created is not None:
            hooks.on_created(session)  # type: ignore[arg-type]
        return (folder / "runs" / "runs.jsonl").exists(), session.checkpoints.writes

    assert run(0) == (True, True)
    assert run(1) == (False, False)


@pytest.mark.slow
def test_torchrun_on_the_package_ends_where_train_procs_2_in_the_notebook_does(
    package: Path, tmp_path: Path
) -> None:
    """The same notebook code both ways, 2 gloo ranks of the notebook's batch each, the loader
    unshuffled and sharded by a `DistributedSampler` (rank r takes samples r, r+2, ...): its
    cells in an IPython shell with the training cell under `%%train --procs 2`, and the package
    `trainmate refactor` wrote from it under `torchrun`. The final weights agree."""
    import nbformat
    import torch
    from IPython.core.interactiveshell import InteractiveShell

    from jupyter_trainmate import last_run

    notebook = nbformat.read(NOTEBOOKS / f"{PACKAGE}.ipynb", as_version=4)
    InteractiveShell.clear_instance()
    ip = InteractiveShell.instance()
    try:
        ip.run_line_magic("load_ext", "jupyter_trainmate")
        trained = False
        for cell in notebook.cells:
            if cell.cell_type != "code":
                continue
            source = cell.source
            if source.startswith("history = []"):  # the training cell
                before = {k: v.clone() for k, v in ip.user_ns["model"].state_dict().items()}
                source = "%%train --procs 2 --backend gloo --display off\n" + source
                trained = True
            ip.run_cell(source).raise_error()
        assert trained
        in_notebook = {k: v.detach().clone() for k, v in ip.user_ns["model"].state_dict().items()}
        assert len(ip.user_ns["history"]) == 3 * 256 // 64  # rank 0's steps: 4 a epoch
        summary = last_run()
        assert summary is not None
        assert any("32 per rank x 2 ranks" in event for event in summary.events)
        assert all(not torch.equal(in_notebook[k], before[k]) for k in in_notebook)
    finally:
        InteractiveShell.clear_instance()
    two = torchrun(package, tmp_path, 2, "--checkpoint", "two.pt", "--device", "cpu")
    assert two.returncode == 0, (two.stdout + two.stderr)[-3000:]
    under_torchrun = torch.load(tmp_path / "two.pt", weights_only=True)
    assert list(under_torchrun) == list(in_notebook)
    for key, value in in_notebook.items():
        assert torch.allclose(under_torchrun[key], value, rtol=1e-5, atol=1e-6), key
