"""Gemma 3n's per-layer AltUp and LAuReL tensors (the code that reads them: models/gemma3n.py)."""

from __future__ import annotations

from gguf.constants import MODEL_TENSOR as TN


def tensors(cfg) -> list:
    """A layer's AltUp (cfg.altup streams) and LAuReL (rank cfg.laurel_rank) tensors (parts.LayerTensor)."""
    d, n, rank = cfg.dim, cfg.altup, cfg.laurel_rank
    return [(("laurel_l",), TN.LAUREL_L, "weight", (rank, d), None),
            (("laurel_r",), TN.LAUREL_R, "weight", (d, rank), None),
            (("laurel_norm",), TN.LAUREL_POST_NORM, "weight", (d,), None),
            (("altup_correct_coef",), TN.ALTUP_CORRECT_COEF, "weight", (n, n), "plain"),
            (("altup_correct_scale",), TN.ALTUP_CORRECT_SCALE, "weight", (d,), None),
            (("altup_predict_coef",), TN.ALTUP_PREDICT_COEF, "weight", (n * n, n), "plain"),
            (("altup_router",), TN.ALTUP_ROUTER, "weight", (n, d), "plain"),
            (("altup_router_norm",), TN.ALTUP_ROUTER_NORM, "weight", (d,), None)]
