"""Memory estimates and the KV pool's size: what a model needs, and what fits a budget.

The KV pool is fixed-size blocks that the running sequences share (prefix-cached blocks live in it
too, evicted least recently used first). By default it holds one full context: the same KV memory as
llama.cpp's unified cache for that context, however many sequences share it (the scheduler preempts
and recomputes the lowest-priority sequence when blocks run out). With a memory budget the pool takes
whatever the budget leaves after the runtime, the weights and the step's buffers, up to one full
context per sequence, and loading fails, naming the smallest budget that fits, if not even one
context fits.

This module reads no files and imports no kernels, models or quant (the engine sizes its pool with it);
file_estimate.py estimates a GGUF file before it is loaded.

Figures are bytes unless a name says MB; an MB here is 2**20 bytes, in the flags as in the reports.

A mixture-of-experts model's weights are all its experts (every expert is resident, whichever the router
picks); its step buffers are sized for the experts a token uses (ModelConfig.n_expert_used). The KV per
token is the cache's own figure: every attention layer holds K and V rows of head_dim (attention.key_length)
and v_head_dim. A sliding-window layer (gemma2, gemma3) holds them in a window pool of its own: per running
sequence the blocks its window spans (Estimate.window_blocks_per_seq), and a step's tokens besides
(window_step_blocks, shared: a step computes at most max_num_batched_tokens), the same at any context
length, so kv_per_token counts the layers that see the whole context alone.
A hybrid model's recurrent layers (short convolutions, Mamba2, gated delta nets) hold no KV: a fixed state
per running sequence instead, the same at any context length, and as many checkpoints of state for prefix
caching (Estimate.state_per_seq counts both).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .config import DEFAULT_MAX_CONTEXT, EngineConfig, ModelConfig
from .errors import EdgeInferError

MB = 2**20
# Resident memory of a process with the runtime imported and the kernels loaded from Numba's cache
# and a tiny model (Python, numpy, Numba, LLVM, the compiled kernels, the thread pool): measured at
# 164 MB on x86-64 Linux, Python 3.11, Numba 0.61 (70 MB its own, 93 MB pages of shared libraries;
# benchmarks/memory_report.py measures it). A budget is for the whole process, so both count.
RUNTIME_BYTES = 165 * MB
MIN_TOKENS_PER_SEQ = 256  # with a budget, the number of sequences is cut so each has at least this much KV
# With no --max-context the context is the model's trained one, cut so that one context's KV takes at most
# this share of the memory left once the model is loaded (without a budget: of what the machine, or the
# container, has available when it loads; with a budget: all of what the budget leaves), never below
# MIN_CONTEXT tokens.
KV_SHARE = 0.5
MIN_CONTEXT = 256


class MemoryBudgetError(EdgeInferError):
    """A memory budget that cannot hold the model: the message names what does not fit."""


@dataclass(frozen=True)
class Estimate:
    """What one model needs: its weights, its KV per token for each KV type, its step buffers."""

    weights: int
    kv_per_token: dict  # kv type -> bytes per token (all layers, K and V)
    buffers: int  # the compiled step's activations for a full token budget, the logits, scratch
    max_context: int
    active_weights: int = 0  # MoE: the weights one token reads (its experts' share); 0: all of them
    state_per_seq: int = 0  # a hybrid model's recurrent state, per running sequence (constant in the context)
    window_kv_per_token: dict | None = None  # kv type -> bytes per token in the sliding-window layers
    window_blocks_per_seq: int = 0  # a running sequence's blocks in the window pool between steps (0: no pool)
    window_step_blocks: int = 0  # and a step's tokens' blocks, at most, whichever sequences they are of
    block_size: int = 16
    trained_context: int = 0  # the model's own context length (its GGUF's context_length)

    def kv(self, kv_type: str, tokens: int) -> int:
        return self.kv_per_token[kv_type] * tokens

    def window_kv(self, kv_type: str, blocks: int) -> int:
        """The bytes of `blocks` blocks of the window pool."""
        return blocks * self.block_size * self.window_kv_per_token[kv_type] if self.window_blocks_per_seq else 0

    def fixed(self, kv_type: str, seqs: int = 1) -> int:
        """What `seqs` running sequences need whatever the context: weights, buffers, their windows and a step's
        (sliding-window layers), their recurrent states."""
        window = self.window_kv(kv_type, seqs * self.window_blocks_per_seq + self.window_step_blocks)
        return self.weights + self.buffers + window + seqs * self.state_per_seq

    def minimum(self, kv_type: str) -> int:
        """This model's share of a budget with the smallest pool: one full context."""
        return self.fixed(kv_type) + self.kv(kv_type, self.max_context)

    def context_within(self, kv_type: str, room: int) -> int:
        """The longest context, at most the trained one and a whole number of blocks, whose KV fits in room
        bytes; at least MIN_CONTEXT tokens (or the trained context, if shorter)."""
        trained = self.trained_context or self.max_context  # (0: an estimate made without a model)
        per_token = self.kv_per_token[kv_type]
        if per_token == 0:  # no layer holds KV for the whole context (a recurrent model): the trained one
            return trained
        fit = max(room, 0) // per_token // self.block_size * self.block_size
        return min(trained, max(fit, MIN_CONTEXT))


def max_context(cfg: ModelConfig, config: EngineConfig) -> int:
    """config's context, or where it gives none (an engine made without LLM, which sizes it by memory:
    context_for_memory) the model's capped at DEFAULT_MAX_CONTEXT."""
    return config.max_context or min(cfg.context_length, DEFAULT_MAX_CONTEXT)


def context_for_memory(est: Estimate, config: EngineConfig, available: int) -> tuple[int, str]:
    """With no --max-context and no budget: the trained context, cut so that one context's KV (of
    config's KV type) takes at most KV_SHARE of the `available` bytes left once the model is loaded with
    what every sequence it may run needs besides (windows, recurrent state); available: measured before
    loading it, less what other models already hold -> (context, why, for the start-up line)."""
    t = config.kv_dtype
    left = available - RUNTIME_BYTES - est.fixed(t, config.seqs_limit)
    ctx = est.context_within(t, int(KV_SHARE * left))
    if ctx >= est.trained_context:
        return ctx, "the model's trained context"
    return ctx, (f"the model's {est.trained_context} cut so its KV ({t}) takes at most {KV_SHARE:.0%} of the "
                 f"{max(left, 0) / MB:.0f} MB left after the model (--max-context sets it)")


def _ffn_rows(cfg: ModelConfig) -> tuple[int, int]:
    """(float32, int8) values per token of a layer's FFN: a dense FFN's gate, up and down input; an MoE
    layer's router logits and, for each expert a token uses, its gate, up and output, plus the shared expert."""
    n_expert = getattr(cfg, "n_expert", 0)
    if not n_expert:
        return 3 * cfg.ffn_dim, cfg.ffn_dim
    used, fe, shared = cfg.n_expert_used, cfg.expert_ffn_dim, cfg.shared_ffn_dim
    if getattr(cfg, "layer_shapes", ()):  # Gemma 4's experts run beside a dense FFN of ffn_dim
        shared = cfg.ffn_dim
    return n_expert + used * (2 * fe + cfg.dim) + 3 * shared, used * fe + shared


def estimate(weight_bytes: int, cfg: ModelConfig, config: EngineConfig, kv_formats: dict,
             active_weights: int = 0) -> Estimate:
    """kv_formats: the KV row formats (a backend's KV_FORMATS, as the engine passes them, or the kernels'
    one table, kernels/kv_format.py, as file_estimate passes it before any backend is loaded)."""
    T = config.max_num_batched_tokens
    if cfg.layer_shapes:  # layers of their own sizes: the largest of each
        shapes = [cfg.at(i) for i in range(cfg.n_layer)]
        cfg = replace(cfg, **{k: max(getattr(c, k) for c in shapes)
                              for k in ("n_head", "n_kv_head", "head_dim", "v_head_dim", "ffn_dim")})
    ffn_f32, ffn_q8 = _ffn_rows(cfg)
    per_row = (4 * cfg.dim + ffn_f32 + (cfg.n_head + 2 * cfg.n_kv_head) * cfg.head_dim
               + cfg.n_head * cfg.v_head_dim  # float32 activations alive at once in a layer
               + 2 * cfg.n_layer * getattr(cfg, "per_layer_dim", 0)  # Gemma's per-layer inputs (a token's, made once)
               + 3 * cfg.dim * max(getattr(cfg, "altup", 0) - 1, 0))  # Gemma 3n's other streams, predicted and corrected
    quantized = cfg.dim + ffn_q8 + cfg.n_head * cfg.v_head_dim  # int8 copies, plus scales (~1/8)
    buffers = T * (4 * per_row + quantized * 9 // 8) + 2 * config.seqs_limit * cfg.vocab_size * 4
    n_window, bs, ctx = len(cfg.window_layers), config.block_size, max_context(cfg, config)
    full = len(cfg.kv_layers) - n_window
    # a sequence's next step sees window - 1 tokens before its first, in two blocks more than they fill at
    # most (one partly behind the window, one the step starts in)
    per_seq = min(-(-(cfg.sliding_window - 1) // bs) + 2, -(-ctx // bs)) if n_window else 0
    # each pool's rows (Gemma 4's sliding-window layers have rows of their own shape)
    full_cfg, win_cfg = (replace(cfg, **dict(zip(("n_kv_head", "head_dim", "v_head_dim"), cfg.pool_shape(w))))
                         for w in (False, True))
    return Estimate(weights=weight_bytes, kv_per_token=_per_token(kv_formats, full_cfg, full),
                    buffers=buffers, max_context=ctx, active_weights=active_weights,
                    state_per_seq=2 * getattr(cfg, "state_bytes_per_seq", 0),  # its slot, and a checkpoint's
                    window_kv_per_token=_per_token(kv_formats, win_cfg, n_window),
                    window_blocks_per_seq=per_seq, window_step_blocks=-(-T // bs) if n_window else 0, block_size=bs,
                    trained_context=cfg.context_length)


def _per_token(kv_formats: dict, cfg: ModelConfig, n_layers: int) -> dict:
    """KV type -> bytes one token's K and V take in n_layers layers of cfg's shape: every type for both, then
    every K/V pair of two ("q8_0/f16": K's rows in the first, V's in the second)."""
    out = {t: f.bytes_per_token(cfg, n_layers) for t, f in kv_formats.items()}
    for k, fk in kv_formats.items():
        for v, fv in kv_formats.items():
            if k != v:
                out[f"{k}/{v}"] = n_layers * cfg.n_kv_head * (fk.row_bytes(cfg.head_dim) + fv.row_bytes(cfg.v_head_dim))
    return out


def default_blocks(est: Estimate, config: EngineConfig) -> int:
    """The pool without a budget: one full context (within config.kv_cache_mb, where that is set)."""
    bs = config.block_size
    per_block = max(est.kv_per_token[config.kv_dtype] * bs, 1)  # 0 for a model with no attention layer
    blocks = -(-est.max_context // bs)
    if config.kv_cache_mb:
        blocks = min(blocks, int(config.kv_cache_mb * MB // per_block))
    return max(1, blocks)


def window_blocks(est: Estimate, config: EngineConfig, blocks: int) -> int:
    """The window pool beside a full pool of `blocks` blocks: each running sequence's window and one step's
    tokens, and never more than the full pool (a sequence's window blocks are some of the positions its full
    blocks hold, so the window pool never runs out first)."""
    if not est.window_blocks_per_seq:
        return 0
    return min(blocks, config.seqs_limit * est.window_blocks_per_seq + est.window_step_blocks)


def pool_bytes(est: Estimate, config: EngineConfig, blocks: int) -> int:
    """The KV pools' bytes: `blocks` blocks of the layers that see the whole context, and the window pool."""
    t = config.kv_dtype
    return blocks * config.block_size * est.kv_per_token[t] + est.window_kv(t, window_blocks(est, config, blocks))


def fit_budget(estimates: list[Estimate], configs: list[EngineConfig], budget_mb: float,
               names: list[str] | None = None) -> list[EngineConfig]:
    """Engine configs for models that share one process and a budget of budget_mb MiB: each model's KV
    pool gets one full context plus a share of what is left (in proportion to its KV per token), up
    to one context per sequence; its sequences are cut so each has MIN_TOKENS_PER_SEQ tokens of KV, and
    a hybrid model's to those whose recurrent state its share holds.
    Raises MemoryBudgetError naming the parts and the smallest budget that would fit."""
    names = names or [f"model {i + 1}" for i in range(len(estimates))]
    budget = int(budget_mb * MB)
    estimates = _contexts_within(estimates, configs, budget)
    need = RUNTIME_BYTES + sum(e.minimum(c.kv_dtype) for e, c in zip(estimates, configs))
    if need > budget:
        parts = [f"runtime {RUNTIME_BYTES / MB:.0f} MB"]
        for n, e, c in zip(names, estimates, configs):
            parts.append(f"{n}: weights {e.weights / MB:.0f} MB + buffers {e.buffers / MB:.0f} MB + KV for one "
                         f"{e.max_context}-token context {e.kv(c.kv_dtype, e.max_context) / MB:.0f} MB ({c.kv_dtype})")
        raise MemoryBudgetError(
            f"a memory budget of {budget_mb:g} MB is too small: {'; '.join(parts)}; the smallest budget that fits "
            f"is {-(-need // MB)} MB (a shorter --max-context or --kv-type q8_0 needs less)")
    spare = budget - need
    weights = [max(e.kv_per_token[c.kv_dtype], 1) * e.max_context for e, c in zip(estimates, configs)]
    out = []
    for e, c, w in zip(estimates, configs, weights):
        bs = c.block_size
        share = spare * w // sum(weights)
        # a hybrid model: the recurrent state of each sequence past the first comes out of its share, as does
        # a sliding-window model's window
        fixed = e.state_per_seq + e.window_kv(c.kv_dtype, e.window_blocks_per_seq)
        state_seqs = min(c.seqs_limit - 1, share // fixed) if fixed else c.seqs_limit
        share -= state_seqs * fixed
        kv_bytes = e.kv(c.kv_dtype, e.max_context) + share
        blocks = kv_bytes // max(e.kv_per_token[c.kv_dtype] * bs, 1)
        ctx_blocks = -(-e.max_context // bs)
        blocks = max(ctx_blocks, min(blocks, c.seqs_limit * ctx_blocks))
        seqs = max(1, min(c.seqs_limit, blocks * bs // MIN_TOKENS_PER_SEQ, 1 + state_seqs))
        out.append(replace(c, num_kv_blocks=int(blocks), max_seqs=int(seqs), max_context=e.max_context))
    return out


def _contexts_within(estimates: list[Estimate], configs: list[EngineConfig], budget: int) -> list[Estimate]:
    """The estimates with the context of each model given none (config.max_context 0) sized to the budget:
    what it leaves after the runtime, the models' fixed needs and the given contexts' KV, shared in proportion
    to the KV of each one's trained context (every such context cut by the same factor, if at all). Sized so
    that all its sequences fit beside it (their windows and recurrent states), or, where that is shorter
    than DEFAULT_MAX_CONTEXT, so that one does (fewer sequences then: fit_budget cuts them)."""
    auto = [i for i, c in enumerate(configs) if not c.max_context]
    if not auto:
        return estimates
    given = sum(e.kv(c.kv_dtype, e.max_context) for i, (e, c) in enumerate(zip(estimates, configs)) if i not in auto)
    want = [estimates[i].kv(configs[i].kv_dtype, estimates[i].trained_context) for i in auto]

    def contexts(seqs) -> list[int]:
        room = budget - RUNTIME_BYTES - given - sum(e.fixed(c.kv_dtype, seqs(c)) for e, c in zip(estimates, configs))
        return [estimates[i].context_within(configs[i].kv_dtype, room * w // sum(want) if sum(want) else room)
                for i, w in zip(auto, want)]

    every = contexts(lambda c: c.seqs_limit)
    one = contexts(lambda c: 1)
    out = list(estimates)
    for i, a, b in zip(auto, every, one):
        out[i] = replace(estimates[i], max_context=max(a, min(b, DEFAULT_MAX_CONTEXT)))
    return out


def report(est: Estimate, config: EngineConfig) -> dict:
    """The estimate as `edgeinfer inspect --memory` prints it (MB)."""
    blocks = default_blocks(est, config)
    kv = pool_bytes(est, config, blocks)
    out = {
        "weights_mb": round(est.weights / MB, 1),
        "kv_mb_per_1k_tokens": {t: round(b * 1000 / MB, 2) for t, b in est.kv_per_token.items()
                                if "/" not in t or t == config.kv_dtype},  # each type, and the pair in use
        "buffers_mb": round(est.buffers / MB, 1),
        "runtime_mb": round(RUNTIME_BYTES / MB, 1),
        "max_context": est.max_context,
        "default_kv_type": config.kv_dtype,
        "default_kv_pool_mb": round(kv / MB, 1),
        "total_mb": round((RUNTIME_BYTES + est.weights + est.buffers + kv + est.state_per_seq * config.seqs_limit) / MB,
                          1),
    }
    if est.window_blocks_per_seq:  # sliding-window layers: a window per running sequence, in a pool of their own
        bs, wb = config.block_size, window_blocks(est, config, blocks)
        out["window_kv_mb_per_seq"] = {t: round(est.window_kv(t, est.window_blocks_per_seq) / MB, 2)
                                       for t in est.window_kv_per_token if "/" not in t or t == config.kv_dtype}
        out["window_kv_pool_mb"] = round(est.window_kv(config.kv_dtype, wb) / MB, 1)
        out["window_kv_tokens_per_seq"] = est.window_blocks_per_seq * bs
        out["window_kv_step_tokens"] = est.window_step_blocks * bs  # a step's tokens, whichever sequences'
        # the sequences whose windows it holds at once, beside a step (the full pool bounds it when smaller)
        out["window_kv_seqs"] = max(0, wb - est.window_step_blocks) // est.window_blocks_per_seq
    if est.state_per_seq:  # a hybrid model: its recurrent layers' state, one per running sequence
        out["recurrent_state_mb_per_seq"] = round(est.state_per_seq / MB, 3)
        out["recurrent_state_mb"] = round(est.state_per_seq * config.seqs_limit / MB, 2)
        out["recurrent_state_seqs"] = config.seqs_limit  # a slot for each sequence that may run at once
    if est.active_weights:
        out["active_weights_mb"] = round(est.active_weights / MB, 1)  # read per token (decode's memory traffic)
    return out
