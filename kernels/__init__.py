"""Compute kernels. ``get_backend("cpu" | "cuda")`` returns the backend module."""
