"""What a GGUF file will need once loaded, read from its header without loading its weights: the
weights as repacked (quant/repack.loaded_bytes), the KV per token of each KV type (the kernels' one
table of KV row formats), the step's buffers (memory.estimate). `edgeinfer inspect --memory`, the
server's budget and LLM's memory budget use it, and so does the sizing of a context nobody gave
(context_for_memory); the engine sizes its pool with memory.py alone."""

from __future__ import annotations

import os
from dataclasses import replace

from . import memory
from .config import EngineConfig
from .kernels.kv_format import KV_FORMATS
from .memory import Estimate, estimate
from .memory_available import available_memory
from .models import model_config
from .quant.repack import loaded_bytes


def is_expert_tensor(info) -> bool:
    """An MoE layer's experts: one 3-D tensor (cols, rows, n_expert) per projection (ffn_{gate,up,down}_exps)."""
    return len(info.shape) == 3 and "_exps." in info.name


def _interleaved(backend: str = "cpu") -> bool:
    # whether the weights load in the interleaved layout: on the CPU backend's SIMD paths (the portable path and
    # the CUDA backend keep rows, Q6_K's values a byte each)
    if backend != "cpu":
        return False
    from .kernels.cpu.simd.paths import choose_path

    try:
        return choose_path() != "portable"
    except Exception:  # e.g. a forced path this CPU lacks: loading says so; the estimate counts rows
        return False


def _loaded(info, interleaved: bool) -> int:
    n = 1
    for d in info.shape:
        n *= int(d)
    return loaded_bytes(info.ggml_type, n, info.n_bytes, interleaved)


def weight_bytes(gf, backend: str = "cpu") -> int:
    """Bytes the loaded weights occupy: the file's tensor data, every expert of an MoE model included, as
    repacked for this host's kernels on `backend` (quant/repack.loaded_bytes: the K-quants' 6-bit scales a byte
    each, Q6_K's values a byte each on the portable path and CUDA, IQ4_XS 4.5 bits a weight rather than 4.25)."""
    x8 = _interleaved(backend)
    return sum(_loaded(info, x8) for info in gf.tensors.values())


def active_weight_bytes(gf, n_expert: int, n_used: int, backend: str = "cpu") -> int:
    """Bytes of weights one token reads: all but the experts, and n_used of n_expert of those."""
    x8 = _interleaved(backend)
    dense = sum(_loaded(t, x8) for t in gf.tensors.values() if not is_expert_tensor(t))
    experts = sum(_loaded(t, x8) for t in gf.tensors.values() if is_expert_tensor(t))
    return dense + experts * n_used // max(1, n_expert)


def estimate_file(gf, config: EngineConfig) -> Estimate:
    """The estimate for the model in an open GGUFFile, without loading its weights."""
    cfg = model_config(gf)
    n_expert = getattr(cfg, "n_expert", 0)
    active = active_weight_bytes(gf, n_expert, cfg.n_expert_used, config.backend) if n_expert else 0
    return estimate(weight_bytes(gf, config.backend), cfg, config, KV_FORMATS, active)


def context_for_memory(gf, config: EngineConfig, held: int = 0) -> tuple[EngineConfig, str]:
    """config with the context of the model in an open GGUFFile sized to the memory available now, less `held`
    bytes (what models already loaded hold but have not touched yet: their KV pools) (memory.context_for_memory),
    and why that context, in words. For a model with LongRoPE factors (which apply by the context, to every
    sequence: the same text must not get other factors on a machine with more memory) and on a backend other
    than the CPU (which allocates the whole pool at load, on the device): the model's capped at
    DEFAULT_MAX_CONTEXT, as before contexts were sized by memory."""
    est = estimate_file(gf, config)
    capped = f"the model's, capped at {memory.DEFAULT_MAX_CONTEXT}"
    if config.backend != "cpu":
        return replace(config, max_context=est.max_context), f"{capped} (on {config.backend}, --max-context sets it)"
    available = available_memory()
    if available is None:
        return replace(config, max_context=est.max_context), f"{capped} (the memory available could not be read)"
    ctx, why = memory.context_for_memory(est, config, available - held)
    if "rope_factors_long.weight" in gf.tensors and ctx > est.max_context:
        ctx, why = est.max_context, f"{capped} (LongRoPE's factors follow the context: --max-context sets it)"
    return replace(config, max_context=ctx), why


def fit_budget_for(gf, config: EngineConfig) -> EngineConfig:
    """config with its context (where it gives none), KV pool and sequences sized to config.memory_budget_mb
    for the model in an open GGUFFile."""
    return memory.fit_budget([estimate_file(gf, config)], [config], config.memory_budget_mb,
                             [os.path.basename(gf.path)])[0]
