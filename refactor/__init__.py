"""
`trainmate refactor`: turn a notebook into a typed, tested Python package.

The pipeline reads like pdoc's, one module per step, each step's result a frozen object handed to
the next (`pipeline.py` runs them in this order):

1. `read`: the notebook's cells, IPython-only lines turned into Python or notes (`Notebook`).
2. `analyze`: every top-level statement as an `Item` (what it binds, from `binds`, and reads,
   from `globalnames`: CPython's `symtable` over `ast`), bad cells.
3. `plan`: where everything goes (`Plan`): `versions` binds each call to the definition live
   there (after `renames`: the package's own names, and an import a later value or definition
   replaces becomes a version), `params` turns notebook state into parameters (or module
   state).
4. `emit`: the source files (`Emitted`): `imports` per module, `compose` + `sections` cut the
   script into section functions (`display` says which only show; `definite` which names a
   section binds on every path, so one bound in a branch only comes in or starts as None) and
   `functions` writes them
   and `run(config)`; `distribute` wires `run()` for `torchrun` (loaders sharded, models
   wrapped, the sections after the training on rank 0; `distributed.py` from
   `templates/distributed.py.tmpl`); `configfile`, `project` (pyproject, README, `__main__.py`
   from `templates/main.py.tmpl`, `train.sbatch`); `docs` adds the docstrings; `writefiles`
   gives the Python files the notebook wrote with `%%writefile` the notebook's imports they read.
5. `annotate`: the types, inferred over the whole package (`symbols`, `infer`, `scope`, `flow`,
   `reaching`, `uses`, `known`; `traced` with `--execute`), written in (`typeexpr`) and checked by mypy
   (`typecheck`: a rejected annotation is removed, a function whose own code fails gets
   `@no_type_check`, a variable mypy asks the type of gets it from `declare`; `mypytypes` reads
   the types mypy inferred on the clean package where the inference left a parameter or a
   return open) (`Annotated`).
6. `testgen`: the generated tests (`Generated`; `characterise` for recorded fixtures).
7. `output`: formats with ruff and writes atomically.
8. `gate`, `docs.build_html`, `equivalence`: the checks on the written package.
9. `report`: `REFACTOR_REPORT.md` from all of it (`Outcome`).

The steps read libcst trees through `walk` (a read-only walk over the nodes' fields: libcst's own
visitors rebuild every node they pass; `walk.isa` asks `isinstance` per type) and rewrite them
with libcst's transformers; `analyze` takes where statements start and what they read from
Python's `ast` and `symtable` (`globalnames`); `cut` runs
the transformers that change a few signatures of a big module on those signatures alone (the
same text as libcst's round trip of the whole module, for a fraction of its cost).

With `--execute`, `trace` runs the notebook first and records types and fixtures, in a fresh
folder that `workdir` fills with a copy of the files beside the notebook (its data); the
`equivalence` run of the package gets the same, and both start from `equivalence.SEED`. This package
imports only `jupyter_trainmate.rewrite` and `jupyter_trainmate.runtime` from the runtime; the
runtime never imports it.

## Where the package is written

`trainmate refactor nb.ipynb` writes a new folder `nb/` beside the notebook (`-o` chooses
another); the notebook itself is only read. The refactor never removes or overwrites a file it did
not write:

- an output folder that holds the notebook (`-o .` beside it, or any folder above it) is refused,
  with or without `--force`: the package would be mixed with your files;
- an existing output folder is refused without `--force`;
- each run lists the files it wrote, with their SHA-256, in `.trainmate-refactor.json` in the
  output folder. With `--force`, a later run replaces those files, removes those the new package
  no longer has, and leaves every other file in the folder (your notes, data, `.git`, a virtual
  environment) untouched. It refuses a folder that is not empty and has no such list, a listed
  file you edited since (move it away or delete it, then run again), and a file of yours where
  the package puts one of its own.

A new folder appears in one step (written beside it, then renamed); in an existing one each file is
replaced in one step.
"""
