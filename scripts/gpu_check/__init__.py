"""The GPU acceptance check: `make gpu-check` (`python -m scripts.gpu_check.gpu_check`) runs every path only a GPU
takes, on one machine (docs/gpu.md)."""
