"""The checks of scripts/gpu_check.py, one module per kind (docs/gpu.md)."""
