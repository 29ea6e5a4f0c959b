"""Which type each tensor gets: llama.cpp's per-tensor rules (llama-quantize, src/llama-quant.cpp) for
the plain types, the K-quant mixes Q2_K, Q3_K_S, Q3_K_M, Q3_K_L, Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M and Q6_K,
and the 4-bit non-linear mixes IQ4_NL and IQ4_XS; MXFP4_MOE (gpt-oss's: every 3-D expert tensor MXFP4, every
other quantized tensor Q8_0).

Tensors take their rule from their role in the name, as llama.cpp's tensor categories: a fused attn_qkv
(phi3) is an attn_v; an MoE layer's 3-D experts (ffn_{gate,up,down}_exps) and shared expert
(ffn_*_shexp) are the FFN tensors they replace, an MoE ffn_down's layer read from its name; a model of
exactly 8 experts gets Mixtral's bumps of attn_v/attn_k (Q8_0) and attn_output (Q5_K). Routers
(ffn_gate_inp, ffn_gate_inp_shexp), RoPE factor tables (rope_freqs, rope_factors_*) and every norm
(q/k norms, post-norms) are never quantized. Some low-bit rules read the model's GQA ratio (n_head /
n_head_kv of the first layer, as llama.cpp's hparams.n_gqa()): Q2_K's and IQ4_*'s attn_v get more bits
when 4 or more query heads share each KV head.

Not expressed: the Falcon-only rules (no Falcon models here) and the "70B" bump of attn_v from Q3_K/Q4_K
to Q5_K (llama.cpp's LLM_TYPE_70B: an 80-layer Llama with GQA, Qwen2-72B, ...), which needs the model's
size class. The rules that depend on an importance matrix (IQ4_NL/IQ4_XS's Q5_K ffn_down layers only without
one, Q4_0/Q5_0's Q4_1/Q5_1 ffn_down layers only with one) follow plan()'s has_imatrix."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
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
    "Q3_K": (FT.MOSTLY_Q3_K_S, T.Q3_K, False),  # every tensor Q3_K (as --pure)
    "Q4_K": (FT.MOSTLY_Q4_K_S, T.Q4_K, False),  # every tensor Q4_K (as --pure)
    "Q5_K": (FT.MOSTLY_Q5_K_S, T.Q5_K, False),
    "Q2_K": (FT.MOSTLY_Q2_K, T.Q2_K, True),
    "Q3_K_S": (FT.MOSTLY_Q3_K_S, T.Q3_K, True),
    "Q3_K_M": (FT.MOSTLY_Q3_K_M, T.Q3_K, True),
    "Q3_K_L": (FT.MOSTLY_Q3_K_L, T.Q3_K, True),
    "Q4_K_S": (FT.MOSTLY_Q4_K_S, T.Q4_K, True),
    "Q4_K_M": (FT.MOSTLY_Q4_K_M, T.Q4_K, True),
    "Q5_K_S": (FT.MOSTLY_Q5_K_S, T.Q5_K, True),
    "Q5_K_M": (FT.MOSTLY_Q5_K_M, T.Q5_K, True),
    "Q6_K": (FT.MOSTLY_Q6_K, T.Q6_K, True),
    "IQ4_NL": (FT.MOSTLY_IQ4_NL, T.IQ4_NL, True),
    "IQ4_XS": (FT.MOSTLY_IQ4_XS, T.IQ4_XS, True),
    "MXFP4_MOE": (FT.MOSTLY_MXFP4_MOE, T.MXFP4, True),
}
QUANTIZED = {T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS,
             T.MXFP4}
TENSOR_TYPES = {t.name: t for t in (T.F32, T.F16, T.BF16, *sorted(QUANTIZED, key=lambda t: t.value))}
# rows whose length is not a multiple of a 256-block type's fall back to a 32-block type (llama.cpp's
# tensor_type_fallback); a row that is not a multiple of 32 either, or of a 32-block type's, takes F16
FALLBACK = {T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0, T.IQ4_XS: T.IQ4_NL, T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}


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


# never quantized whatever their shape (llama.cpp's tensor_allows_quantization, the parts that apply here):
# the MoE routers (ffn_gate_inp, and qwen2moe's shared-expert gate ffn_gate_inp_shexp), the RoPE
# frequency tables (rope_freqs: Llama 3.x; rope_factors_short/long: Phi-3), BERT's position and
# token-type embeddings; norms (attn_q_norm, ffn_post_norm, ...) by their "_norm.weight" suffix; the small
# convolution taps of the recurrent layers (Mamba's ssm_conv1d, LFM2's shortconv.conv); Gemma 4's per-layer
# input projection (per_layer_model_proj: "not too big") and Gemma 3n's small altup and laurel matrices
_KEEP_PARTS = ("_norm.weight", "ffn_gate_inp", "rope_freqs", "rope_factors", "ssm_conv1d", "shortconv.conv.weight",
               "per_layer_model_proj", "altup", "laurel")
_KEEP_NAMES = ("position_embd.weight", "token_types.weight")
_BLOCK = re.compile(r"blk\.(\d+)\.")


def _quantizable(name: str, n_dims: int) -> bool:
    return (n_dims >= 2 and name.endswith("weight") and not any(p in name for p in _KEEP_PARTS)
            and name not in _KEEP_NAMES)


def _category(name: str) -> str:
    """llama.cpp's tensor_get_category: broad roles by name. A fused attn_qkv (Phi-3) and an MLA attn_kv_b
    count as attn_v; experts (ffn_*_exps) and shared experts (ffn_*_shexp) as their dense counterparts."""
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):  # (Gemma 4's per-layer table as llama.cpp)
        return "token_embd"
    for part, cat in (("attn_qkv.weight", "attn_v"), ("attn_kv_b.weight", "attn_v"), ("attn_v.weight", "attn_v"),
                      ("attn_k.weight", "attn_k"), ("attn_q.weight", "attn_q"), ("attn_output.weight", "attn_output"),
                      ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"), ("ffn_down", "ffn_down")):
        if part in name:
            return cat
    return "other"


def _more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _head_count(v) -> int:
    """ARCH.attention.head_count(_kv) as one number: a per-layer array gives its first layer's (as
    llama.cpp's n_gqa(0)); missing or not a count: 0."""
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if isinstance(v, (list, tuple)):
        v = v[0] if v else 0
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v > 0:
        return int(v)
    return 0


def _attn_v_type(mix: str, default: T, i: int, n: int, n_gqa: int) -> tuple[T, str]:
    """An attn_v-like tensor's type (the i-th of n) before the 8-expert bump."""
    if mix == "Q2_K":
        return (T.Q4_K, "GQA >= 4") if n_gqa >= 4 else (T.Q3_K, "attn_v")
    if mix == "Q3_K_M":
        return (T.Q5_K, "first layers") if i < 2 else (T.Q4_K, "attn_v")
    if mix == "Q3_K_L":
        return T.Q5_K, "attn_v"
    if mix in ("IQ4_NL", "IQ4_XS") and n_gqa >= 4:
        return T.Q5_K, "GQA >= 4"
    if mix in ("Q4_K_M", "Q5_K_M") and _more_bits(i, n):
        return T.Q6_K, "more bits"
    if mix == "Q4_K_S" and i < 4:
        return T.Q5_K, "first layers"
    return default, ""


def _ffn_down_type(mix: str, default: T, i: int, n: int, has_imatrix: bool = False) -> tuple[T, str]:
    """ffn_down's type in layer i of n (not Falcon); some rules apply only with (or without) an imatrix."""
    if mix == "Q2_K":
        return T.Q3_K, "ffn_down"
    if mix == "Q3_K_M":
        return (T.Q5_K, "first layers") if i < n // 16 else (T.Q4_K, "ffn_down")
    if mix == "Q3_K_L":
        return T.Q5_K, "ffn_down"
    if mix in ("Q4_K_M", "Q5_K_M") and _more_bits(i, n):
        return T.Q6_K, "more bits"
    if mix in ("IQ4_NL", "IQ4_XS") and i < n // 8 and not has_imatrix:
        return T.Q5_K, "first layers"
    if mix == "Q4_K_S" and i < n // 8:
        return T.Q5_K, "first layers"
    if mix in ("Q4_0", "Q5_0") and i < n // 8 and has_imatrix:  # llama.cpp's guard for the first ffn_down layers
        return (T.Q4_1 if mix == "Q4_0" else T.Q5_1), "first layers, imatrix"
    return default, ""


def _attn_output_type(mix: str, default: T, n_expert: int) -> tuple[T, str]:
    if n_expert == 8:  # Q3_K_L is not among the mixes that take this bump
        if mix in ("Q2_K", "Q3_K_S", "Q3_K_M", "Q4_K_S", "Q4_K_M", "IQ4_NL", "IQ4_XS"):
            return T.Q5_K, "8 experts"
        return default, ""
    if mix == "Q2_K":
        return T.Q3_K, "attn_output"
    if mix == "Q3_K_M":
        return T.Q4_K, "attn_output"
    if mix == "Q3_K_L":
        return T.Q5_K, "attn_output"
    return default, ""


def plan(tensors: list[tuple[str, tuple[int, ...], T]], type_name: str, *, pure: bool = False,
         output_type: T | None = None, token_embedding_type: T | None = None,
         n_expert: int = 0, n_head=0, n_head_kv=None, has_imatrix: bool = False) -> list[PlannedTensor]:
    """tensors: (name, ggml shape, source type) in file order; n_expert: the model's expert count
    (ARCH.expert_count; 0 for a dense model); n_head, n_head_kv: ARCH.attention.head_count and
    head_count_kv (a number or a per-layer array; n_head_kv None: as n_head, llama.cpp's default), whose
    ratio (0 when unknown) some low-bit mixes read; has_imatrix: quantizing with an importance matrix (a
    few of llama.cpp's rules depend on it). Returns each tensor's target type.

    A 3-D tensor (an MoE layer's experts, ggml shape (cols, rows, n_expert)) is n_expert matrices of
    one type; the rules read its role from its name as for a 2-D one."""
    ftype, default, mixed = TYPES[type_name]
    mixed = mixed and not pure
    names = [t[0] for t in tensors]
    tied = "output.weight" not in names
    n_attn_v = sum(1 for n in names if _category(n) == "attn_v")
    n_ffn_down = sum(1 for n in names if "ffn_down" in n)
    blocks = [int(m.group(1)) for m in map(_BLOCK.match, names) if m]
    n_layer = max(blocks) + 1 if blocks else n_ffn_down
    heads, heads_kv = _head_count(n_head), _head_count(n_head if n_head_kv is None else n_head_kv)
    n_gqa = heads // heads_kv if heads_kv else 0
    i_attn_v = i_ffn_down = 0
    out = []
    # llama.cpp counts attn_v and ffn_down layers in its loader's order (weight_name_comparer: by block number,
    # then name), not the file's: a file written blk.0, blk.1, blk.10, ... gets its bumps on the same layers
    for name, shape, src in sorted(tensors, key=lambda t: loader_order(t[0])):
        if not _quantizable(name, len(shape)):
            out.append(PlannedTensor(name, shape, src, src, "kept"))
            continue
        cat = _category(name)
        is_output = cat == "output" or (tied and cat == "token_embd")
        if token_embedding_type is not None and cat == "token_embd":
            out.append(PlannedTensor(name, shape, src, token_embedding_type, "--token-embedding-type"))
            continue
        if output_type is not None and cat == "output":
            out.append(PlannedTensor(name, shape, src, output_type, "--output-type"))
            continue
        new = default
        note = ""
        if default in QUANTIZED:
            if mixed and type_name == "MXFP4_MOE":  # llama.cpp's: experts MXFP4, the rest (output too) Q8_0
                experts = len(shape) == 3 and shape[2] > 1 and not is_output
                new, note = (T.MXFP4, "experts") if experts else (T.Q8_0, "not experts")
            elif mixed:
                if is_output:
                    if output_type is not None:
                        new = output_type
                    elif shape[0] % GGML_QUANT_SIZES[new][0] != 0:
                        new = T.Q8_0
                    elif new != T.Q8_0:
                        new = T.Q6_K
                    note = "output"
                elif cat == "attn_v":
                    # llama.cpp counts attn_qkv among the attn_v tensors: the same bumps, one counter
                    new, note = _attn_v_type(type_name, new, i_attn_v, n_attn_v, n_gqa)
                    if n_expert == 8:  # Mixtral-like: "bumping this to Q8_0 trades just ~128MB"
                        new, note = T.Q8_0, "8 experts"
                    i_attn_v += 1
                elif cat == "attn_k" and n_expert == 8:
                    new, note = T.Q8_0, "8 experts"
                elif cat == "attn_output":
                    new, note = _attn_output_type(type_name, new, n_expert)
                elif cat == "ffn_down":
                    # a dense model's layer is the count of ffn_down tensors so far, of as many as the model
                    # has layers (llama.cpp's n_layer_all, also where some layers have none: Nemotron-H); an MoE
                    # model's is read from the name (its experts and shared expert are more than one ffn_down
                    # per layer)
                    i, n = i_ffn_down, n_layer
                    m = _BLOCK.match(name)
                    if n_expert > 1 and m:
                        i, n = int(m.group(1)), n_layer
                    new, note = _ffn_down_type(type_name, new, i, n, has_imatrix)
                    i_ffn_down += 1
            if shape[0] % GGML_QUANT_SIZES[new][0] != 0:
                fb = FALLBACK.get(new, T.F16)
                if shape[0] % GGML_QUANT_SIZES[fb][0] != 0:
                    fb = T.F16
                note = f"row {shape[0]} not a multiple of {GGML_QUANT_SIZES[new][0]}: {new.name} -> {fb.name}"
                new = fb
        out.append(PlannedTensor(name, shape, src, new, note))
    by_name = {x.name: x for x in out}
    return [by_name[t[0]] for t in tensors]  # in the file's order


def loader_order(name: str) -> tuple[int, str]:
    """llama.cpp's loader order of tensors (weight_name_comparer): by block (none first), then by name."""
    m = _BLOCK.match(name)
    return (int(m.group(1)) if m else -1, name)
