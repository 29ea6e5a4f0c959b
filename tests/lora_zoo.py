"""Random LoRA adapters for the arch zoo's models (tests/arch_zoo.py), written with gguf.GGUFWriter as
llama.cpp's convert_lora_to_gguf.py writes them: `general.type` "adapter", `adapter.type` "lora", the base
model's architecture, `adapter.lora.alpha` (where the adapter has one), and per adapted tensor NAME the pair
NAME.lora_a (rank x n_in) and NAME.lora_b (n_out x rank); the token embeddings' pair swapped (A (vocab, rank),
B (dim, rank)), as llama.cpp reads it. Deterministic (fixed seeds): tests/golden/lora.json (made by
benchmarks/make_lora_golden.py with llama.cpp) records each file's sha256.

    from lora_zoo import ADAPTERS, write_adapter
    write_adapter("llama3_all", base_path, out_path)
"""

from __future__ import annotations

import gguf
import numpy as np
from gguf.constants import GGMLQuantizationType as T

from edgeinfer.gguf_file import GGUFFile

try:
    from tiny_models import add_tensor as _add, finish as _finish
except ImportError:  # imported as tests.lora_zoo
    from .tiny_models import add_tensor as _add, finish as _finish

# name -> (base zoo model, rank, alpha (None: no key), tensor type, the base tensors' kinds it adapts, seed,
# the low-rank product's size beside the base matrix's output)
ADAPTERS = {
    # every matrix llama.cpp adapts in a llama layer, the untied output and the token embeddings
    "llama3_all": ("llama3", 8, 16.0, T.F32, ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                                             "ffn_down", "output", "token_embd"), 11, 0.25),
    # a smaller F16 adapter without alpha (the scale alone), on a few matrices
    "llama3_f16": ("llama3", 4, None, T.F16, ("attn_q", "attn_v", "ffn_down"), 12, 0.3),
    # phi3's fused q/k/v and gate/up matrices: one pair each, split by the engine as the matrices are
    "phi3_fused": ("phi3", 16, 8.0, T.F32, ("attn_qkv", "ffn_up", "attn_output"), 13, 0.5),
}

# what llama.cpp ran for the golden data: case -> [(adapter, scale), ...] on the adapters' base model
CASES = {
    "llama3_all": [("llama3_all", 1.0)],
    "llama3_f16_scaled": [("llama3_f16", 0.7)],
    "llama3_stacked": [("llama3_all", 0.5), ("llama3_f16", 1.5)],
    "phi3_fused": [("phi3_fused", 1.0)],
}


def base_of(case: str) -> str:
    return ADAPTERS[CASES[case][0][0]][0]


def write_adapter(name: str, base_path, path) -> None:
    """Adapter `name` (ADAPTERS) for the zoo model at base_path, written to path."""
    write_random_adapter(base_path, path, *ADAPTERS[name][1:])


def write_random_adapter(base_path, path, rank: int, alpha: float | None, qtype, kinds, seed: int,
                         size: float) -> None:
    """A random adapter of this rank for the model at base_path (a zoo model or a real one: benchmarks/
    lora_speed.py), on each of its matrices of these kinds ("attn_q", ..., "output", "token_embd")."""
    rng = np.random.default_rng(seed)
    with GGUFFile(base_path) as gf:
        arch = gf.architecture
        shapes = {n: tuple(reversed(info.shape)) for n, info in gf.tensors.items()}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_type("adapter")
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    if alpha is not None:
        w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    mult = size * rank / (alpha or rank)  # so that B (A x) * alpha / rank is about `size` of a unit output
    for base, shape in shapes.items():
        kind = base.split(".")[-2] if base.startswith("blk.") else base.split(".")[0]
        if kind not in kinds or len(shape) != 2 or not base.endswith(".weight"):
            continue
        n_out, n_in = shape
        if kind == "token_embd":  # A (vocab, rank) of rows looked up by token, B (dim, rank)
            a = rng.standard_normal((n_out, rank))
            b = rng.standard_normal((n_in, rank)) * (mult / np.sqrt(rank))
        else:
            a = rng.standard_normal((rank, n_in)) / np.sqrt(n_in)
            b = rng.standard_normal((n_out, rank)) * (mult / np.sqrt(rank))
        _add(w, base + ".lora_a", a, qtype)
        _add(w, base + ".lora_b", b, qtype)
    _finish(w)
