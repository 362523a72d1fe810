"""The wheel carries the prebuilt lab extension and the server config; installing it needs no Node.

Builds the wheel from a copy of this checkout (hatch-jupyter-builder runs npm), installs it into a
fresh virtual environment whose PATH holds no `node`, and asks Jupyter itself whether the extensions
are there, enabled and OK.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import jupyter_trainmate

ROOT = Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run(cmd: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return ANSI.sub("", proc.stdout + proc.stderr)


def checkout_copy(dest: Path) -> Path:
    """The checkout's files (tracked, and untracked ones git does not ignore) copied to `dest`,
    the lab extension's `node_modules` linked. The wheel's build hook runs `npm run build:prod`,
    which empties and rebuilds `jupyter_trainmate/labextension` in the tree it builds: in the
    checkout itself, that pulled the extension from under the browser tests of the other pytest
    worker (`make test` runs two)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode()  # fmt: skip
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if not source.is_symlink() and not source.is_file():
            continue  # deleted in the working tree, not yet in git
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest / name, follow_symlinks=False)
    modules = ROOT / "labextension" / "node_modules"
    if modules.is_dir():  # `make test` installed them (npm ci) before pytest
        (dest / "labextension" / "node_modules").symlink_to(modules, target_is_directory=True)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    source = checkout_copy(tmp_path_factory.mktemp("checkout"))
    run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(source)])
    (built,) = dist.glob("jupyter_trainmate-*.whl")
    return built


@pytest.mark.slow
def test_wheel_contents(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    data = f"jupyter_trainmate-{jupyter_trainmate.__version__}.data/data"
    lab = f"{data}/share/jupyter/labextensions/jupyter-trainmate"
    assert f"{lab}/package.json" in names
    assert f"{lab}/install.json" in names
    assert f"{lab}/static/style.js" in names
    assert f"{lab}/schemas/jupyter-trainmate/sidebar.json" in names  # the settings schemas
    assert f"{lab}/schemas/jupyter-trainmate/notifications.json" in names
    assert any(re.fullmatch(rf"{lab}/static/remoteEntry\.[0-9a-f]+\.js", n) for n in names)
    assert f"{data}/etc/jupyter/jupyter_server_config.d/jupyter_trainmate.json" in names
    assert "jupyter_trainmate/py.typed" in names
    # refactor/ is installed as jupyter_trainmate.refactor: PyPI's unrelated `refactor` owns the name
    assert "jupyter_trainmate/refactor/__init__.py" in names
    assert "jupyter_trainmate/refactor/pipeline.py" in names
    assert "jupyter_trainmate/refactor/templates/main.py.tmpl" in names  # package data
    assert {n.split("/")[0] for n in names if "/" in n and ".dist-info/" not in n} == {
        "jupyter_trainmate",
        f"jupyter_trainmate-{jupyter_trainmate.__version__}.data",
    }
    assert not any(n.startswith("refactor") for n in names)
    assert not any("node_modules" in n or n.endswith(".ts") for n in names)


@pytest.mark.slow
def test_wheel_installs_without_node(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    bin_dir = venv / "bin"
    env = {**os.environ, "PATH": str(bin_dir), "NO_COLOR": "1"}
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)  # the checkout must not shadow what the wheel installed
    env.pop("JUPYTER_PATH", None)
    env.pop("JUPYTER_CONFIG_PATH", None)
    assert shutil.which("node", path=env["PATH"]) is None
    assert shutil.which("npm", path=env["PATH"]) is None
    python = str(bin_dir / "python")
    # The same torch as here first: a bare `torch` requirement would pull a multi-GB CUDA build.
    run([python, "-m", "pip", "install", "-q", f"torch=={torch.__version__.split('+')[0]}"], env)
    which_torch = (
        "import torch, os; print('torch', torch.__version__, os.stat(torch.__file__).st_mtime_ns)"
    )

    def installed_torch() -> str:  # torch may warn on stderr (no numpy yet): read the stdout line
        out = run([python, "-c", which_torch], env, tmp_path)
        return next(line for line in out.splitlines() if line.startswith("torch "))

    torch_before = installed_torch()
    run([python, "-m", "pip", "install", "-q", str(wheel)], env)
    # The torch that was there (a CUDA build a user chose, say) is kept, not replaced.
    assert installed_torch() == torch_before
    magic = (
        "from IPython.core.interactiveshell import InteractiveShell as S; ip = S.instance(); "
        "ip.run_line_magic('load_ext', 'jupyter_trainmate'); print(sorted(ip.magics_manager.magics['cell']))"
    )
    assert "'train'" in run([python, "-c", magic], env, tmp_path)

    labext = run([str(bin_dir / "jupyter"), "labextension", "list"], env, cwd=tmp_path)
    assert re.search(rf"jupyter-trainmate v{jupyter_trainmate.__version__} enabled\s+OK", labext), (
        labext
    )
    server = run([str(bin_dir / "jupyter"), "server", "extension", "list"], env, cwd=tmp_path)
    assert re.search(r"jupyter_trainmate enabled", server), server
    assert re.search(rf"jupyter_trainmate {jupyter_trainmate.__version__} OK", server), server
    version = run([str(bin_dir / "trainmate"), "--version"], env, cwd=tmp_path)
    assert version.strip() == f"jupyter_trainmate {jupyter_trainmate.__version__}"

    assert "--force" in run([str(bin_dir / "trainmate"), "refactor", "--help"], env, cwd=tmp_path)
    notebook = ROOT / "tests" / "notebooks" / "old_v3.ipynb"
    plan = run([str(bin_dir / "trainmate"), "refactor", str(notebook), "--dry-run"], env, tmp_path)
    assert "## Cells" in plan  # the pipeline imports from the installed wheel
    where = "import importlib.util as u; print(u.find_spec('refactor'), u.find_spec('{}').origin)"
    found = run([python, "-c", where.format("jupyter_trainmate.refactor.pipeline")], env, tmp_path)
    assert found.split()[0] == "None", found  # no top-level `refactor` module installed
    assert str(venv) in found, found
