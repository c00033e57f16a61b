"""Training throughput and memory benchmark for one GPU, in one process (`python -m bench.train_bench`)."""
