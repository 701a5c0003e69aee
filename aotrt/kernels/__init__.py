"""Kernel IR and its renderers (C for the cpu device, CUDA C for the cuda device)."""
