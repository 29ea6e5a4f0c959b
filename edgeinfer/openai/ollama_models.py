"""What Ollama's /api/tags and /api/show tell about a GGUF file (details, model_info, template,
capabilities) and the bodies of those two routes. Pure functions of a GGUFFile: no HTTP, no model loaded."""

from __future__ import annotations

import math

from .. import harmony, reasoning
from .ollama_options import is_int
from .times import rfc3339

_BIG_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores")


def human_count(n: int) -> str:
    """A parameter count as Ollama shows it: 135M, 1.5B."""
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    if n >= 1e6:
        return f"{n / 1e6:.0f}M"
    return f"{n / 1e3:.0f}K"


def quantization_level(gf) -> str:
    """general.file_type's name (Q4_K_M, F16, ...), or else the type most of the matrices are stored in."""
    import gguf

    ft = gf.get("general.file_type")
    try:
        return gguf.LlamaFileType(int(ft)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (TypeError, ValueError):
        counts: dict[str, int] = {}
        for t in gf.tensors.values():
            if len(t.shape) >= 2:
                counts[t.type_name] = counts.get(t.type_name, 0) + t.n_elements
        return max(counts, key=counts.get) if counts else "unknown"


def _jsonable(v):
    import numpy as np

    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class _Vocab:
    """A vocabulary's token texts, all fim.fim_tokens reads of a tokenizer (no tokenizer is built)."""

    def __init__(self, tokens: list[str]):
        self.tokens = tokens


def _can_infill(gf, tokens: list[str]) -> bool:
    from .fim import fim_tokens

    return fim_tokens(_Vocab(tokens), gf).can_infill


def model_facts(gf) -> dict:
    """What /api/tags and /api/show tell about one GGUF file: details, model_info (its metadata, the big
    vocabulary arrays left empty as Ollama does unless verbose), the chat template, capabilities."""
    from ..info import parameters

    arch = gf.get("general.architecture", "unknown")
    n_params, _ = parameters(gf)
    info = {}
    for k, v in gf.metadata.items():
        if k == "tokenizer.chat_template":
            continue
        info[k] = [] if k in _BIG_ARRAYS else _jsonable(v)
    info["general.parameter_count"] = int(n_params)
    tokens = gf.get("tokenizer.ggml.tokens") or []
    from ..models import ENCODERS

    encoder = arch in ENCODERS
    template = gf.get("tokenizer.chat_template") or ""
    caps = ["embedding"] if encoder else ["completion", "tools"] + (["insert"] if _can_infill(gf, tokens) else []) \
        + (["thinking"] if reasoning.template_thinks(template) or harmony.is_harmony(template) else [])
    ctx = gf.get(f"{arch}.context_length")
    details = {"parent_model": "", "format": "gguf", "family": arch, "families": [arch],
               "parameter_size": human_count(n_params), "quantization_level": quantization_level(gf)}
    return {"details": details, "model_info": info, "template": template,
            "capabilities": caps, "context_length": int(ctx) if is_int(ctx) else None}


def tag_entry(name: str, size: int, mtime: float, digest: str, facts: dict) -> dict:
    """One model in /api/tags: Ollama's NAME:latest, its file's size and sha256, the details."""
    tag = f"{name}:latest"
    return {"name": tag, "model": tag, "modified_at": rfc3339(mtime, "microseconds"), "size": size, "digest": digest,
            "details": facts["details"]}


def show_reply(name: str, path: str, mtime: float, facts: dict) -> dict:
    """/api/show: a Modelfile as Ollama would write one, the parameters, template, details, model_info,
    capabilities."""
    ctx = facts["context_length"]
    params = f"{'num_ctx':<30} {ctx}" if ctx else ""
    modelfile = (f"# Modelfile of {name}, as edgeinfer serves it\nFROM {path}\n"
                 + (f'TEMPLATE """{facts["template"]}"""\n' if facts["template"] else "")
                 + (f"PARAMETER num_ctx {ctx}\n" if ctx else ""))
    return {"modelfile": modelfile, "parameters": params, "template": facts["template"], "details": facts["details"],
            "model_info": facts["model_info"], "capabilities": facts["capabilities"],
            "modified_at": rfc3339(mtime, "microseconds")}
