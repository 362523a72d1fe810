"""How well the explained-errors rules name the kind of real error messages.

Reads the labelled sets in tests/data/ (real messages from public issue trackers, each with its
source and a kind given by hand): `real_errors.jsonl`, the set the rules were written against,
and `real_errors_heldout.jsonl`, collected after the rules were frozen and never used to change
them. For each set: the share classified correctly, the misleading ones (a wrong kind other than
`unknown`: worse than no answer) and the misses (`unknown` for a known kind), per kind.

    python benchmarks/explain_accuracy.py
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from jupyter_trainmate.explain.classify import classify

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"


def score(path: Path) -> tuple[int, int, list[str], list[str], Counter[str]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    correct = 0
    misleading, missed = [], []
    kinds: Counter[str] = Counter()
    for row in rows:
        kinds[row["kind"]] += 1
        got = classify(row["exception"], row["message"])[0]
        if got == row["kind"]:
            correct += 1
        elif got == "unknown":
            missed.append(f"{row['kind']} -> unknown: {row['source']}")
        else:
            misleading.append(f"{row['kind']} -> {got}: {row['source']}")
    return correct, len(rows), misleading, missed, kinds


def main() -> None:
    for name in ("real_errors.jsonl", "real_errors_heldout.jsonl"):
        correct, total, misleading, missed, kinds = score(DATA / name)
        print(f"{name}: {correct}/{total} correct ({correct / total:.1%}), "
              f"{len(misleading)} misleading, {len(missed)} missed")  # fmt: skip
        print("  by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
        for line in misleading + missed:
            print(f"  {line}")


if __name__ == "__main__":
    main()
