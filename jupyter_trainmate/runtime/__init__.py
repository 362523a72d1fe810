"""
What instrumented training code calls: device transfer, prefetching, step timing, mixed precision.

No IPython imports here: the same runtime serves `%%train` in a notebook and the packages that
`trainmate refactor` emits.
"""
