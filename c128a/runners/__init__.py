"""The command-line tools' work: the fuzz runner, the kill matrix and reach
tables, the benchmark and the throughput mode, bisection and history over
vLLM revisions. Nothing in the library, its conformance suite or its pytest
plugin imports them. (``cases``, ``gpus`` and ``sanitizer`` here are the
former names of :mod:`c128a.cases`, :mod:`c128a.gpu.pinning` and
:mod:`c128a.gpu.compute_sanitizer`.)"""
