"""GPU benchmarks (run with ``python -m benchmarks`` on a machine with a CUDA GPU and PyTorch)."""
