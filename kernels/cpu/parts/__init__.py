"""The parts of a layer of the compiled step (step.py), one module per kind of part.

A layer is a sequence of parts: a norm, a mixer (attention), a post-norm and the residual add, then a norm,
the FFN (dense, or the experts of a mixture), a post-norm and the residual add. Each kind of part is one
module here holding
- a NamedTuple of what its compiled code reads: its switches and sizes, its per-layer vectors stacked over
  the layers, and where each layer's matrices are in the step's typed list of matrices (by name);
- `build(cfg, layers, ...)`, which makes that tuple from a model's layers at load;
- the compiled functions the step calls for the part, written in the same row functions as the per-op
  kernels (models/parts/ holds the per-op reference of each part, which runs on any backend).
A new kind of part (a recurrent mixer, a convolution, per-layer inputs) is a module beside these, a field
of LayerStack and a call in step.py's layer walk; the tuples are typed for the precompile from a stand-in
LayerStack (step.stand_in_args), so nothing types them by hand.
"""

from __future__ import annotations

import numpy as np

from .. import int8
from .rows import needs


def gather(layers, inputs: dict, mats: list) -> tuple[dict, dict]:
    """Each layer's matrices named in `inputs` (name -> the input it reads) appended to mats as
    int8.as_tuple tuples -> ({name: (n_layer,) int64, where each layer's matrix is in mats},
    {input: (n_layer,) int64, the quantizations of it the layer's matrices read (rows.needs)}). A layer
    without the matrix (a MoE layer's missing shared expert) gets position -1: its code never runs."""
    n = len(layers)
    at = {name: np.full(n, -1, np.int64) for name in inputs}
    need = {i: np.zeros(n, np.int64) for i in inputs.values()}
    for i, lw in enumerate(layers):
        for name, inp in inputs.items():
            w = getattr(lw, name, None)
            if w is not None:
                need[inp][i] |= needs(w.kind)
                at[name][i] = len(mats)
                mats.append(int8.as_tuple(w))
    return at, need


def stack(layers, name: str, size: int, fill: float = 1.0) -> np.ndarray:
    """The layers' vectors `name` stacked (n_layer, size) float32; `fill` for a layer without one."""
    rows = [getattr(lw, name, None) for lw in layers]
    return np.stack([r if r is not None else np.full(size, fill, np.float32) for r in rows]).astype(np.float32)
