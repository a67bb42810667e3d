"""The GPU side of a run that the library, its conformance suite and its
pytest plugin share: pinning worker processes to GPUs
(:mod:`~c128a.gpu.pinning`) and builds under NVIDIA's compute-sanitizer
(:mod:`~c128a.gpu.compute_sanitizer`). Importing this package imports neither."""
