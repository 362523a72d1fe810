"""Ready to deploy: ONNX export checked in onnxruntime, int8 quantisation, inference benchmarks.

Internal: users call `jupyter_trainmate.export()` / `jupyter_trainmate.bench()`, `trainmate
export|bench` or `%trainmate export|bench`. One job per module: `deps` (the optional packages),
`inputs` (the example, its names and batch axis), `export` (the exporters and the atomic write),
`parity` (onnxruntime against PyTorch), `quantize` (int8), `report` (`ExportReport`), `bench` and
`bench_report` (latency and throughput), `command` (the CLI and magic front end).
"""
