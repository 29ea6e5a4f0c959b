"""Compute kernels behind one interface.

``get_backend("cpu")`` returns a module with the same functions in every backend:
``matmul(w, x, out)``, ``embed(w, ids)``, ``dequantize(w)``, ``rmsnorm``, ``rope``, ``write_kv``,
``paged_attention``, ``silu_mul``, ``gelu_tanh_mul``, ``softcap``, ``zeros``, ``set_threads``.
"""

BACKENDS = ("cpu",)


def get_backend(name: str = "cpu"):
    if name == "cpu":
        from .cpu import backend

        return backend
    raise ValueError(f"unknown backend {name!r} (available: {', '.join(BACKENDS)})")
