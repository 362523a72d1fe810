"""The public API is `jupyter_trainmate.__all__`, importable without torch."""

from __future__ import annotations

import subprocess
import sys

import jupyter_trainmate


def test_every_public_name_resolves_and_is_documented() -> None:
    for name in jupyter_trainmate.__all__:
        value = getattr(jupyter_trainmate, name)
        if name != "__version__":
            assert (value.__doc__ or "").strip(), name


def test_errors_users_catch_are_public() -> None:
    assert issubclass(jupyter_trainmate.NanDetected, jupyter_trainmate.TrainmateError)
    from jupyter_trainmate.runtime.guards import NanDetected

    assert NanDetected is jupyter_trainmate.NanDetected


def test_importing_the_package_does_not_import_torch() -> None:
    code = "import sys, jupyter_trainmate; print(sorted({'torch', 'libcst', 'tornado'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
