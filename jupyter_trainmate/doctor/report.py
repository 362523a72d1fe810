"""Render doctor findings as an aligned text table or as JSON."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict

from .._version import __version__
from .checks import Finding

MARK = {"ok": "ok", "warn": "WARN", "fail": "FAIL"}


def passed(findings: Sequence[Finding]) -> bool:
    """True when no finding failed (warnings do not fail the doctor)."""
    return all(f.status != "fail" for f in findings)


def to_json(findings: Sequence[Finding]) -> str:
    counts = Counter(f.status for f in findings)
    return json.dumps(
        {
            "jupyter_trainmate": __version__,
            "ok": passed(findings),
            "summary": {status: counts.get(status, 0) for status in ("ok", "warn", "fail")},
            "checks": [asdict(f) for f in findings],
        },
        indent=2,
        default=str,
    )


def to_table(findings: Sequence[Finding]) -> str:
    rows = [("", "check", "value", "advice")]
    rows += [(MARK[f.status], f.check, f.value, f.advice) for f in findings]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True))
        + ("  " + row[3] if row[3] else "")
        for row in rows
    ]
    counts = Counter(f.status for f in findings)
    verdict = "no check failed" if passed(findings) else "some checks FAILED"
    lines.append(
        f"\n{counts['ok']} ok, {counts['warn']} warning(s), {counts['fail']} failed: {verdict}"
    )
    return "\n".join(line.rstrip() for line in lines)
