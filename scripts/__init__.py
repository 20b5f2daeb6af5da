"""Tools around the recipe, sorted by kind: the product tools users and the docs call (launch.py with launcher/,
predict.py, compare_runs.py, gen_config_reference.py, slurm/), the benchmarks (bench/) and the GPU
acceptance check (gpu_check/). The packages run as modules from the repository root: `python -m scripts.bench.bench`.
"""
