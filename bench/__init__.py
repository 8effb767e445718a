"""Benchmarks for fusedlp (not tests): ``python -m bench kernels``. See bench/README.md."""
