"""shoal's benchmarks (pytest-benchmark). A package so ``bench.loadgen`` imports by name."""
