"""The tools that run the library: the fuzz runner, failure cases and their
replay, the kill matrix, the benchmark and the throughput mode, and GPU
pinning of worker processes. Nothing in the library imports them."""
