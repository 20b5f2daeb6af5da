"""The benchmarks: `make bench` (`python -m scripts.bench.bench`) runs every bench_*.py here, each a module that
prints a Markdown table with its own baseline measured in the same run (docs/benchmarks.md)."""
