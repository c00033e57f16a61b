"""GPU benchmarks of the training loop (run as `python -m bench.train_bench`)."""
