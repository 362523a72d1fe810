"""
`trainmate refactor`: turn a notebook into a typed, tested Python package.

The pipeline reads like pdoc's, one module per step: read -> analyze -> plan -> emit -> testgen
-> annotate (symbols, infer/scope/flow/known, traced, typecheck) -> docs -> verify. This package imports only `jupyter_trainmate.rewrite` and
`jupyter_trainmate.runtime` from the runtime; the runtime never imports it.
"""
