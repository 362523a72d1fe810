"""
Internal (for contributors): `trainmate doctor`: the checks a practitioner runs before a long training job.

Each check gives a `Finding`: ok, warn or fail, the value it saw and one line of advice. No GPU or
no NVML is a normal answer. `run_checks()` gathers them; `report` renders a table or JSON.
"""

from __future__ import annotations

from pathlib import Path

from .checks import Finding, system_findings
from .storage import DataPathError, storage_findings

__all__ = ["DataPathError", "Finding", "run_checks"]


def run_checks(data: Path | None = None) -> list[Finding]:
    """Run every check; with `data`, also the file system checks of that path."""
    findings = system_findings()
    if data is not None:
        findings += storage_findings(data)
    return findings
