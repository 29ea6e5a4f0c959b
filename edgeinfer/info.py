"""A summary of a GGUF model file, for `edgeinfer inspect` and `edgeinfer list`."""

from __future__ import annotations

from typing import Any

from .gguf_file import GGUFFile


def _tokenizer_kind(model: str | None) -> str:
    return {"gpt2": "BPE (GPT-2 byte-level)", "llama": "SentencePiece", None: "none"}.get(model, str(model))


def summarize(gf: GGUFFile) -> dict[str, Any]:
    arch = gf.architecture
    g = lambda key, default=None: gf.get(f"{arch}.{key}", default)  # noqa: E731
    tokens = gf.get("tokenizer.ggml.tokens")
    n_vocab = g("vocab_size") or (len(tokens) if tokens is not None else None)
    counts = gf.type_counts()
    nbytes = gf.type_bytes()
    order = sorted(counts, key=lambda t: (-counts[t], t))
    return {
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
        "kv_heads": g("attention.head_count_kv", g("attention.head_count")),
        "vocab_size": int(n_vocab) if n_vocab is not None else None,
        "tokenizer": _tokenizer_kind(gf.get("tokenizer.ggml.model")),
        "tokenizer_pre": gf.get("tokenizer.ggml.pre"),
        "chat_template": gf.get("tokenizer.chat_template") is not None,
        "n_tensors": len(gf.tensors),
        "tensor_types": {t: counts[t] for t in order},
        "tensor_bytes": {t: nbytes[t] for t in order},
    }


def quant_mix(summary: dict[str, Any]) -> str:
    return " ".join(f"{t}:{n}" for t, n in summary["tensor_types"].items())
