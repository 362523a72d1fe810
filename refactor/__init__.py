"""
`trainmate refactor`: turn a notebook into a typed, tested Python package.

The pipeline reads like pdoc's, one module per step, each step's result a frozen object handed to
the next (`pipeline.py` runs them in this order):

1. `read`: the notebook's cells, IPython-only lines turned into Python or notes (`Notebook`).
2. `analyze`: every top-level statement as an `Item` (what it binds and reads), bad cells.
3. `plan`: where everything goes (`Plan`): `versions` binds each call to the definition live
   there, `params` turns notebook state into parameters (or module state).
4. `emit`: the source files (`Emitted`): `imports` per module, `compose` + `sections` cut the
   script into section functions (`display` says which only show) and `functions` writes them
   and `run(config)`; `configfile`, `project` (pyproject, README, `__main__.py` from
   `templates/main.py.tmpl`); `annotate` adds the types, `docs` the docstrings.
5. `testgen`: the generated tests (`Generated`).
6. `output`: formats with ruff and writes atomically.
7. `gate`, `docs.build_html`, `equivalence`: the checks on the written package.
8. `report`: `REFACTOR_REPORT.md` from all of it (`Outcome`).

With `--execute`, `trace` runs the notebook first and records types and fixtures. This package
imports only `jupyter_trainmate.rewrite` and `jupyter_trainmate.runtime` from the runtime; the
runtime never imports it.
"""
