"""A summary of a GGUF model file, for `edgeinfer inspect` and `edgeinfer list`."""

from __future__ import annotations

from typing import Any

import numpy as np

from .gguf_file import GGUFFile
from .models import DECODERS, ModelLoadError, model_config


def _tokenizer_kind(model: str | None) -> str:
    return {"gpt2": "BPE (GPT-2 byte-level)", "llama": "SentencePiece", None: "none"}.get(model, str(model))


def _int(v) -> int | None:
    """A metadata count as an int; None for a missing or malformed one (a per-layer array, a string)."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return int(v)
    return None


def _num(v) -> float | None:
    if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
        return float(v)
    return None


def parameters(gf: GGUFFile) -> tuple[int, int]:
    """(parameters, parameters one token uses): every tensor's elements; for a mixture-of-experts model,
    the experts' (3-D ffn_*_exps tensors) counted for expert_used_count of expert_count experts."""
    total = sum(t.n_elements for t in gf.tensors.values())
    arch = gf.get("general.architecture")
    n_expert = _int(gf.get(f"{arch}.expert_count"))
    used = _int(gf.get(f"{arch}.expert_used_count"))
    experts = sum(t.n_elements for t in gf.tensors.values() if len(t.shape) == 3 and "_exps." in t.name)
    if not experts or not n_expert or used is None or not 0 < used <= n_expert:
        return total, total
    return total, total - experts + experts * used // n_expert


def _architecture_facts(gf: GGUFFile, arch: str) -> dict[str, Any]:
    """What sets the new architectures apart, where the file has it: head size, experts, sliding window,
    softcaps, RoPE scaling and frequency factors, q/k norms, fused projections. Absent keys are left out,
    so a plain llama file's summary is what it always was."""
    g = lambda key: gf.get(f"{arch}.{key}")  # noqa: E731
    t = gf.tensors
    out: dict[str, Any] = {}
    heads, dim = _int(g("attention.head_count")), _int(g("embedding_length"))
    head_dim = _int(g("attention.key_length"))
    if head_dim is not None:
        out["head_dim"] = head_dim
    elif heads and dim:
        head_dim = dim // heads
    v_dim = _int(g("attention.value_length"))
    if v_dim is not None and v_dim != head_dim:
        out["value_head_dim"] = v_dim
    n_expert = _int(g("expert_count"))
    if n_expert:
        out["experts"] = n_expert
        out["experts_used"] = _int(g("expert_used_count"))
        exp = t.get("blk.0.ffn_gate_exps.weight")
        ffn = _int(g("expert_feed_forward_length"))
        out["expert_feed_forward_size"] = ffn if ffn is not None else (int(exp.shape[1]) if exp is not None
                                                                       and len(exp.shape) == 3 else None)
        if "blk.0.ffn_up_shexp.weight" in t or _int(g("expert_shared_feed_forward_length")):
            sh = t.get("blk.0.ffn_up_shexp.weight")
            out["shared_expert_feed_forward_size"] = (_int(g("expert_shared_feed_forward_length"))
                                                      or (int(sh.shape[1]) if sh is not None and len(sh.shape) >= 2
                                                          else None))
            out["shared_expert_gate"] = "blk.0.ffn_gate_inp_shexp.weight" in t
    window = _int(g("attention.sliding_window"))
    if window:
        out["sliding_window"] = window
        pattern = g("attention.sliding_window_pattern")
        if pattern is not None:
            out["sliding_window_pattern"] = _int(pattern) if _int(pattern) is not None else "per layer"
    for key, name in (("attn_logit_softcapping", "attention_softcap"), ("final_logit_softcapping", "final_softcap")):
        cap = _num(g(key))
        if cap:
            out[name] = cap
    base = _num(g("rope.freq_base"))
    if base is not None:
        out["rope_freq_base"] = base
    if arch == "smollm3":  # llama.cpp's fixed n_no_rope_layer_step: no key says it
        out["no_rope_layers"] = "every 4th"
    rope_dim = _int(g("rope.dimension_count"))
    if rope_dim is not None and head_dim and rope_dim != head_dim:
        out["rope_dimensions"] = f"{rope_dim} of {head_dim}"
    scaling = g("rope.scaling.type")
    if scaling not in (None, "none"):
        parts = [str(scaling)]
        factor = _num(g("rope.scaling.factor"))
        if factor:
            parts.append(f"factor {factor:g}")
        orig = _int(g("rope.scaling.original_context_length"))
        if orig:
            parts.append(f"from {orig} tokens")
        out["rope_scaling"] = ", ".join(parts)
    elif _int(g("rope.scaling.original_context_length")):
        out["rope_original_context"] = _int(g("rope.scaling.original_context_length"))
    attn_factor = _num(g("rope.scaling.attn_factor"))
    if attn_factor and attn_factor != 1.0:
        out["rope_attn_factor"] = round(attn_factor, 6)
    factors = [f"{n.split('.')[0]} ({t[n].n_elements})" for n in ("rope_freqs.weight", "rope_factors_short.weight",
                                                                   "rope_factors_long.weight") if n in t]
    if factors:
        out["rope_factors"] = ", ".join(factors)
    swa_dim = _int(g("attention.key_length_swa"))
    if swa_dim is not None:  # Gemma 4: the sliding-window layers' heads are their own size
        out["head_dim_sliding"] = swa_dim
    qn = t.get("blk.0.attn_q_norm.weight")
    if qn is not None:
        per_head = head_dim and qn.n_elements in (head_dim, swa_dim)
        out["qk_norm"] = "per head" if per_head else "whole projection"
    shared = _int(g("attention.shared_kv_layers"))
    if shared:
        out["shared_kv_layers"] = f"the last {shared} (they read earlier layers' KV)"
    per_layer = _int(g("embedding_length_per_layer_input"))
    if per_layer:
        out["per_layer_inputs"] = f"{per_layer} a layer"
    kinds = _layer_kinds(gf)
    if kinds:  # a hybrid model: what its layers keep (a delta net's attn_qkv is its own, not a fused attention)
        out["layer_kinds"] = ", ".join(f"{n} {k}" for k, n in kinds.items())
    fused = [name for name, key in (("attn_qkv", "blk.0.attn_qkv.weight"),) if key in t and "deltanet" not in kinds]
    if "blk.0.ffn_up.weight" in t and "blk.0.ffn_gate.weight" not in t and n_expert is None \
            and "blk.0.ffn_down.weight" in t and _ffn_fused(gf, arch):
        fused.append("ffn_up (gate and up)")
    if fused:
        out["fused_tensors"] = ", ".join(fused)
    if "blk.0.attn_norm.weight" not in t and "blk.0.post_attention_norm.weight" in t:
        out["norms"] = "post-norms only"
    elif "blk.0.post_ffw_norm.weight" in t or ("blk.0.post_attention_norm.weight" in t and _post_norms(arch)):
        out["norms"] = "pre- and post-norms"  # (qwen35's and gpt-oss's post_attention_norm is the norm before the FFN)
    return out


def _post_norms(arch: str) -> bool:
    # whether the architecture's layers norm each block's output (an unknown one: as its tensors say)
    return DECODERS[arch].post_norms if arch in DECODERS else True


def _layer_kinds(gf: GGUFFile) -> dict[str, int]:
    """A hybrid model's layers by their mixer ({"deltanet": 18, "attention": 6}); {} for a model whose
    layers are all attention or a file whose metadata does not read."""
    try:
        mixers = model_config(gf).mixers
    except (ModelLoadError, ValueError, KeyError, TypeError):
        return {}
    return {k: mixers.count(k) for k in dict.fromkeys(mixers)}


def _ffn_fused(gf: GGUFFile, arch: str) -> bool:
    """ffn_up holds twice feed_forward_length rows (Phi-3's gate and up in one tensor)."""
    ffn = _int(gf.get(f"{arch}.feed_forward_length"))
    up = gf.tensors["blk.0.ffn_up.weight"]
    return ffn is not None and len(up.shape) == 2 and int(up.shape[1]) == 2 * ffn


def _plain(v):
    # a metadata value as JSON has it: per-layer arrays as lists
    return [x.item() if hasattr(x, "item") else x for x in v] if isinstance(v, (list, tuple)) or hasattr(v, "tolist") \
        else v


def summarize(gf: GGUFFile) -> dict[str, Any]:
    arch = gf.architecture
    g = lambda key, default=None: gf.get(f"{arch}.{key}", default)  # noqa: E731
    tokens = gf.get("tokenizer.ggml.tokens")
    n_vocab = g("vocab_size") or (len(tokens) if tokens is not None else None)
    counts = gf.type_counts()
    nbytes = gf.type_bytes()
    order = sorted(counts, key=lambda t: (-counts[t], t))
    n_params, n_active = parameters(gf)
    out = {
        "path": gf.path,
        "file_size": gf.file_size,
        "gguf_version": gf.version,
        "name": gf.get("general.name"),
        "architecture": arch,
        "context_length": g("context_length"),
        "layers": g("block_count"),
        "embedding_size": g("embedding_length"),
        "feed_forward_size": g("feed_forward_length"),
        "heads": g("attention.head_count"),
        "kv_heads": _plain(g("attention.head_count_kv", g("attention.head_count"))),  # per layer in a hybrid
        "vocab_size": int(n_vocab) if n_vocab is not None else None,
        "tokenizer": _tokenizer_kind(gf.get("tokenizer.ggml.model")),
        "tokenizer_pre": gf.get("tokenizer.ggml.pre"),
        "chat_template": gf.get("tokenizer.chat_template") is not None,
        "parameters": n_params,
    }
    if n_active != n_params:
        out["active_parameters"] = n_active  # per token: the experts it is routed to, and everything else
    out.update(_architecture_facts(gf, arch))
    out.update({
        "n_tensors": len(gf.tensors),
        "tensor_types": {t: counts[t] for t in order},
        "tensor_bytes": {t: nbytes[t] for t in order},
    })
    return out


def quant_mix(summary: dict[str, Any]) -> str:
    return " ".join(f"{t}:{n}" for t, n in summary["tensor_types"].items())
