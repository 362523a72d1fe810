"""
Hyperparameter search from the notebook: `%%train --sweep N`, on Optuna.

| module | job |
|---|---|
| `suggest.py` | `suggest()`, the current trial, `Param` (one dimension), the cell's literal suggest calls |
| `space.py` | `--space`: its syntax, the snapshot of the notebook's training objects, the settings written into param groups |
| `driver.py` | the study loop around `runner.run_cell`: samplers, pruners, reports, failures, Ctrl-C |
| `storage.py` | `runs/optuna.journal`, the process that runs a trial, dead trials on `--resume`, `%trainmate sweeps` |
| `summary.py` | `SweepSummary` (`last_sweep()`), importances |
| `view.py` | the study's widget, static HTML and text |
| `function.py` | `train(fn, "--sweep N")`: the study over a function; a package's `sweep`/`train` commands |
| `parallel.py` | `--parallel K`: trials in K spawned worker processes sharing the journal |
"""
