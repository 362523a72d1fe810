"""
`trainmate refactor`: turn a notebook into a typed, tested Python package.

The pipeline reads like pdoc's, one module per step: read -> analyze -> plan -> emit -> annotate
-> testgen -> docs -> verify. This package imports only `jupyter_trainmate.rewrite` and
`jupyter_trainmate.runtime` from the runtime; the runtime never imports it.

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
