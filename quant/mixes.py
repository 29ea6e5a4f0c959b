"""Which type each tensor gets: llama.cpp's per-tensor rules (llama-quantize) for the plain types and
the K-quant mixes Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M and Q6_K."""

from __future__ import annotations

from dataclasses import dataclass

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T, LlamaFileType as FT

# --type NAME -> (file type written to general.file_type, default tensor type, mix rules apply)
TYPES: dict[str, tuple[FT, T, bool]] = {
    "F32": (FT.ALL_F32, T.F32, False),
    "F16": (FT.MOSTLY_F16, T.F16, False),
    "BF16": (FT.MOSTLY_BF16, T.BF16, False),
    "Q8_0": (FT.MOSTLY_Q8_0, T.Q8_0, True),
    "Q4_0": (FT.MOSTLY_Q4_0, T.Q4_0, True),
    "Q4_1": (FT.MOSTLY_Q4_1, T.Q4_1, True),
    "Q5_0": (FT.MOSTLY_Q5_0, T.Q5_0, True),
    "Q5_1": (FT.MOSTLY_Q5_1, T.Q5_1, True),
    "Q4_K": (FT.MOSTLY_Q4_K_S, T.Q4_K, False),  # every tensor Q4_K (as --pure)
    "Q5_K": (FT.MOSTLY_Q5_K_S, T.Q5_K, False),
    "Q4_K_S": (FT.MOSTLY_Q4_K_S, T.Q4_K, True),
    "Q4_K_M": (FT.MOSTLY_Q4_K_M, T.Q4_K, True),
    "Q5_K_S": (FT.MOSTLY_Q5_K_S, T.Q5_K, True),
    "Q5_K_M": (FT.MOSTLY_Q5_K_M, T.Q5_K, True),
    "Q6_K": (FT.MOSTLY_Q6_K, T.Q6_K, True),
}
QUANTIZED = {T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K}
TENSOR_TYPES = {t.name: t for t in (T.F32, T.F16, T.BF16, *sorted(QUANTIZED, key=lambda t: t.value))}
# rows whose length is not a multiple of a K-quant's 256 fall back to a 32-block type
FALLBACK = {T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}


def parse_type(name: str, table: dict) -> object:
    key = name.upper()
    if key not in table:
        raise ValueError(f"unknown type {name!r} (choose from {', '.join(table)})")
    return table[key]


@dataclass(frozen=True)
class PlannedTensor:
    name: str
    shape: tuple[int, ...]  # ggml order
    src_type: T
    dst_type: T
    note: str = ""

    @property
    def n_bytes(self) -> int:
        block, size = GGML_QUANT_SIZES[self.dst_type]
        n = 1
        for d in self.shape:
            n *= d
        return n // block * size


def _quantizable(name: str, n_dims: int) -> bool:
    return (n_dims >= 2 and name.endswith("weight") and "_norm.weight" not in name
            and "ffn_gate_inp.weight" not in name and name not in ("position_embd.weight", "token_types.weight"))


def _more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def plan(tensors: list[tuple[str, tuple[int, ...], T]], type_name: str, *, pure: bool = False,
         output_type: T | None = None, token_embedding_type: T | None = None) -> list[PlannedTensor]:
    """tensors: (name, ggml shape, source type) in file order. Returns each tensor's target type."""
    ftype, default, mixed = TYPES[type_name]
    mixed = mixed and not pure
    names = [t[0] for t in tensors]
    tied = "output.weight" not in names
    n_attn_v = sum(1 for n in names if "attn_v.weight" in n)
    n_ffn_down = sum(1 for n in names if "ffn_down" in n)
    i_attn_v = i_ffn_down = 0
    out = []
    for name, shape, src in tensors:
        if not _quantizable(name, len(shape)):
            out.append(PlannedTensor(name, shape, src, src, "kept"))
            continue
        is_output = name == "output.weight" or (tied and name == "token_embd.weight")
        if token_embedding_type is not None and name == "token_embd.weight":
            out.append(PlannedTensor(name, shape, src, token_embedding_type, "--token-embedding-type"))
            continue
        if output_type is not None and name == "output.weight":
            out.append(PlannedTensor(name, shape, src, output_type, "--output-type"))
            continue
        new = default
        note = ""
        if default in QUANTIZED:
            if mixed:
                if is_output:
                    if output_type is not None:
                        new = output_type
                    elif shape[0] % GGML_QUANT_SIZES[new][0] != 0:
                        new = T.Q8_0
                    elif new != T.Q8_0:
                        new = T.Q6_K
                    note = "output"
                elif "attn_v.weight" in name or "attn_qkv.weight" in name:
                    if "attn_qkv.weight" in name:
                        new = {"Q4_K_M": T.Q5_K, "Q5_K_M": T.Q6_K}.get(type_name, new)
                    elif type_name in ("Q4_K_M", "Q5_K_M") and _more_bits(i_attn_v, n_attn_v):
                        new, note = T.Q6_K, "more bits"
                    elif type_name == "Q4_K_S" and i_attn_v < 4:
                        new, note = T.Q5_K, "first layers"
                    if "attn_v.weight" in name:
                        i_attn_v += 1
                elif "ffn_down" in name:
                    if type_name in ("Q4_K_M", "Q5_K_M") and _more_bits(i_ffn_down, n_ffn_down):
                        new, note = T.Q6_K, "more bits"
                    elif type_name == "Q4_K_S" and i_ffn_down < n_ffn_down // 8:
                        new, note = T.Q5_K, "first layers"
                    i_ffn_down += 1
            if shape[0] % GGML_QUANT_SIZES[new][0] != 0:
                fb = FALLBACK.get(new, T.F16)
                if shape[0] % GGML_QUANT_SIZES[fb][0] != 0:
                    fb = T.F16
                note = f"row {shape[0]} not a multiple of {GGML_QUANT_SIZES[new][0]}: {new.name} -> {fb.name}"
                new = fb
        out.append(PlannedTensor(name, shape, src, new, note))
    return out
