"""Compute kernels behind one interface.

``get_backend("cpu")`` returns a module with the same functions in every backend:
``quantize_input(x)`` and ``matmul(w, x, out)`` (x: float32 or what quantize_input made), ``embed(w, ids)``, ``dequantize(w)``, ``rmsnorm``, ``rope``, ``write_kv``,
``paged_attention``, ``silu_mul``, ``gelu_tanh_mul``, ``softcap``, the sampling helpers
``argmax_rows``, ``log_softmax_rows`` and ``mask_logits`` (structured output's mask, on host logits), and
the array functions ``upload``, ``prepare_batch``, ``zeros``, ``empty``, ``add_``, ``scale_``, ``take_rows``,
``to_host``, ``kv_store``, ``set_threads``, and ``layer_stack`` (a model's layers as one compiled call, or
None where a backend has none).
"""

BACKENDS = ("cpu", "cuda")


def get_backend(name: str = "cpu"):
    """The backend module; for "cuda", RuntimeError saying what is missing when no GPU is usable."""
    if name == "cpu":
        from .cpu import backend

        return backend
    if name == "cuda":
        from .cuda import backend

        backend.check_available()
        return backend
    raise ValueError(f"unknown backend {name!r} (available: {', '.join(BACKENDS)})")
