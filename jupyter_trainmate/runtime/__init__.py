"""
Internal (for contributors): what instrumented training code calls (`session.TrainSession`, the name `__trainmate__`) and the
collaborators behind it: one job per module (see docs/ARCHITECTURE.md for the map).

No IPython imports here: the same runtime serves `%%train` in a notebook and the packages that
`trainmate refactor` emits.
"""
