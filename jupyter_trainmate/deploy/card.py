"""The export section of a refactored package's `MODEL_CARD.md`.

`trainmate export CHECKPOINT --model PKG.module:builder` on a package written by `trainmate
refactor` (its folder holds the refactor's manifest) writes the export's summary into the
package's `MODEL_CARD.md` between `<!-- trainmate:export:start -->` and `<!-- ...:end -->`:
the section is replaced in place (added at the end the first time), the rest of the file is
left as it is, and the file is replaced atomically. When the card was still the refactor's own
(its hash in the manifest), the manifest gets the new hash, so a later `trainmate refactor
--force` still knows the file as its own; a card the user edited stays the user's. The refactor
writes the same section from the notebook's latest export record (`refactor/docs.py`). No torch.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import TrainmateError
from ..runtime.files import write_text_atomically

START = "<!-- trainmate:export:start -->"
END = "<!-- trainmate:export:end -->"
CARD = "MODEL_CARD.md"
MANIFEST = ".trainmate-refactor.json"  # refactor/manifest.py's NAME


def _size(n: Any) -> str:
    if not isinstance(n, int):
        return "?"
    return f"{n / 1e6:.2f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"


def _specs(specs: Any) -> str:
    if not isinstance(specs, list):
        return "?"
    return ", ".join(
        f"`{s.get('name')}` [{', '.join(str(d) for d in s.get('shape', []))}] {s.get('dtype')}"
        for s in specs
        if isinstance(s, Mapping)
    )


def export_section(report: Mapping[str, Any], when: str = "") -> str:
    """The card's export section (markers included) from an `ExportReport` as JSON."""
    parity = [r for r in report.get("parity", []) if isinstance(r, Mapping)]
    passed = all(r.get("passed") for r in parity)
    worst = max((float(r.get("max_rel", 0.0)) for r in parity), default=0.0)
    sets = (
        ", ".join(
            str(r.get("inputs")) for r in parity if r.get("output") == parity[0].get("output")
        )
        if parity
        else "none"
    )
    lines = [
        START,
        "## Export (ONNX)",
        "",
        f"`{Path(str(report.get('path'))).name}`{f', exported {when}' if when else ''} by "
        f"`trainmate export` with the {report.get('exporter')} exporter: ONNX opset "
        f"{report.get('opset')}, {_size(report.get('size'))}.",
        "",
        f"- inputs: {_specs(report.get('inputs'))}",
        f"- outputs: {_specs(report.get('outputs'))}",
        f"- parity with PyTorch (eval mode) in onnxruntime {report.get('provider')}: "
        f"**{'ok' if passed else 'FAILED'}** on {sets}; largest relative difference "
        f"{worst:.2e} (tolerance {report.get('atol')} + {report.get('rtol')} x |torch|)",
    ]
    quant = report.get("quantization")
    if isinstance(quant, Mapping):
        q_rows = [r for r in quant.get("parity", []) if isinstance(r, Mapping)]
        q_ok = all(r.get("passed") for r in q_rows)
        line = (
            f"- int8 (dynamic, MatMul/Gemm): `{Path(str(quant.get('path'))).name}`, "
            f"{_size(quant.get('size_before'))} -> {_size(quant.get('size_after'))}, parity "
            f"with the float model {'ok' if q_ok else 'FAILED'}"
        )
        if quant.get("metric_float") is not None and quant.get("metric_int8") is not None:
            line += f"; metric float {quant['metric_float']:.6g}, int8 {quant['metric_int8']:.6g}"
        lines.append(line)
    warnings = report.get("warnings") or []
    lines += [f"- warning: {w}" for w in warnings]
    lines += [
        "",
        f"The full report: `{Path(str(report.get('path'))).with_suffix('.export.json').name}`.",
        END,
    ]
    return "\n".join(lines)


def replace_section(text: str, section: str, where: Path) -> str:
    """`text` with the export section replaced (or appended); one marker alone is an error."""
    if START in text and END in text and text.index(START) < text.index(END):
        head, _, rest = text.partition(START)
        _, _, tail = rest.partition(END)
        return head + section + tail
    if START in text or END in text:
        raise TrainmateError(f"{where}: one export marker without the other; fix the file by hand")
    return text + ("\n" if text and not text.endswith("\n") else "") + "\n" + section + "\n"


def package_card(builder: str) -> Path | None:
    """The `MODEL_CARD.md` of the refactored package that `PKG.module:builder` comes from."""
    package = builder.partition(":")[0].split(".")[0]
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    root = Path(spec.origin).resolve().parent.parent
    card = root / CARD
    return card if card.is_file() and (root / MANIFEST).is_file() else None


def update_card(card: Path, report: Mapping[str, Any], when: str = "") -> None:
    """Replace the export section of `card` atomically; keep the refactor's manifest in step."""
    old = card.read_bytes()
    new = replace_section(old.decode("utf-8"), export_section(report, when), card).encode("utf-8")
    if new == old:
        return
    write_text_atomically(card, new.decode("utf-8"))
    manifest = card.parent / MANIFEST
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
        files = data["files"]
        if files.get(CARD) != hashlib.sha256(old).hexdigest():
            return  # the user's card since they edited it: the refactor leaves it alone anyway
        files[CARD] = hashlib.sha256(new).hexdigest()
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return
    write_text_atomically(manifest, json.dumps(data, indent=1) + "\n")
