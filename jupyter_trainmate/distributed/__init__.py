"""`%%train --procs N`: the cell data-parallel in worker processes (`launch`: the notebook's side,
`worker`: each rank's)."""
