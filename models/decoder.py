"""The decoder-only transformer every generative architecture here is, read from an ArchSpec.

An architecture module (llama.py, gemma3.py, qwen2.py) declares its SPEC: what its layer has beyond the
plain llama layer (pre-norm, RoPE, GQA attention, a SiLU-gated FFN). This module reads the spec three
times, and nowhere else is an architecture's shape stated:
- `config_from_gguf`: the GGUF metadata into a ModelConfig;
- `load_layer`: which tensors a layer has, under gguf's own tensor names (gguf.TENSOR_NAMES);
- `Model`: `forward_per_op`, the readable reference (one backend call per op, the CUDA backend's path),
  and the compiled step (kernels/cpu/step.py), which takes the spec's switches as flags.
Adding a llama-family architecture is a spec plus any op it genuinely adds; tests hold the compiled step
to forward_per_op.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
from gguf.constants import MODEL_TENSOR as TN
from gguf.constants import TENSOR_NAMES

from ..config import ModelConfig
from ..gguf_file import GGUFFile
from .common import ModelLoadError, WeightLoader, check_vocab, meta, rope_inv_freq

if TYPE_CHECKING:  # the engine's types, only named here: models never build them
    from ..engine.kv_cache import KVCache
    from ..engine.model_runner import Batch

ACTIVATIONS = ("silu", "gelu_tanh")  # the gated FFN's activation of the gate
# rope.scaling.type values that are supported ("longrope": the rope_factors_short/long tensors, chosen
# by the context length, as llama.cpp does)
ROPE_SCALINGS = ("none", "linear", "longrope")


@dataclass(frozen=True)
class ArchSpec:
    """What one decoder architecture's layer is, beyond the llama layer (the defaults)."""

    name: str  # the GGUF `general.architecture`
    rope_neox: bool = False  # rotate (i, i + n/2) pairs (NeoX) rather than (2i, 2i + 1)
    qkv_bias: bool = False  # biases on the q, k and v projections (qwen2)
    qk_norm: bool = False  # an RMS norm on each q and k head after the projection, before RoPE (gemma3)
    post_norms: bool = False  # RMS norms on the attention and FFN outputs before each residual add (gemma3)
    activation: str = "silu"  # the gated FFN's: silu (SwiGLU) or gelu_tanh (GeGLU)
    embed_scale: bool = False  # token embeddings multiplied by sqrt(dim) (gemma3)
    # sliding-window attention: every swa_pattern-th layer global, the others within
    # `attention.sliding_window` tokens, with their own RoPE base (0: every layer global)
    swa_pattern: int = 0
    rope_base_local: float | None = None
    softcaps: bool = False  # attention- and final-logit softcapping from the metadata (gemma2/3's keys)
    softcap_defaults: tuple[float, float] = (0.0, 0.0)  # (attention, final) caps where the keys are absent
    pre_norms: bool = True  # RMS norms before attention and FFN (olmo2 has only the post-norms)
    qk_norm_full: bool = False  # q and k RMS norms over the whole projection, not per head (olmo2, olmoe)
    fused_gate_up: bool = False  # ffn_up holds the gate's rows then the up rows, no ffn_gate (phi3)
    gemma2_scale: bool = False  # attention scale 1/sqrt(dim / n_head) in the 46-layer model (Gemma 2 27B)
    # mixture of experts: a router and expert FFNs instead of the dense FFN; moe_norm_w: the chosen
    # experts' weights renormalised (qwen3moe); shared_expert: plus a sigmoid-gated shared FFN (qwen2moe)
    moe: bool = False
    moe_norm_w: bool = False
    shared_expert: bool = False
    moe_scale_w: bool = False  # the weights times the file's expert_weights_scale (llama.cpp: not these three)

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")

    @property
    def stack_flags(self) -> dict:
        """The compiled step's switches (kernels.cpu.step.LayerStack)."""
        return {"qk_norm": 2 if self.qk_norm_full else int(self.qk_norm), "post_norms": self.post_norms,
                "gelu": self.activation == "gelu_tanh", "qkv_bias": self.qkv_bias, "pre_norms": self.pre_norms,
                "moe": self.moe, "shared_expert": self.shared_expert}


def config_from_gguf(gf: GGUFFile, spec: ArchSpec) -> ModelConfig:
    a = gf.architecture
    dim = meta(gf, a, "embedding_length", required=True)
    n_head = meta(gf, a, "attention.head_count", required=True)
    head_dim = meta(gf, a, "attention.key_length", dim // n_head)
    emb = gf.tensors.get("token_embd.weight")
    if emb is None:
        raise ModelLoadError("missing tensor 'token_embd.weight'")
    scaling = meta(gf, a, "rope.scaling.type", "none")
    factor = meta(gf, a, "rope.scaling.factor", 1.0) or 1.0
    if scaling not in (*ROPE_SCALINGS, None):
        raise ModelLoadError(f"rope scaling type {scaling!r} is not supported (supported: {', '.join(ROPE_SCALINGS)})")
    n_layer = meta(gf, a, "block_count", required=True)
    cfg = ModelConfig(
        arch=a,
        n_layer=n_layer,
        dim=dim,
        n_head=n_head,
        n_kv_head=meta(gf, a, "attention.head_count_kv", n_head),
        head_dim=head_dim,
        v_head_dim=meta(gf, a, "attention.value_length", head_dim),
        ffn_dim=meta(gf, a, "feed_forward_length", required=not spec.moe) or 0,
        vocab_size=int(emb.shape[1]),
        context_length=meta(gf, a, "context_length", 2048),
        norm_eps=float(meta(gf, a, "attention.layer_norm_rms_epsilon", 1e-5)),
        rope_base=float(meta(gf, a, "rope.freq_base", 10000.0)),
        rope_dim=meta(gf, a, "rope.dimension_count", head_dim),
        rope_neox=spec.rope_neox,
        rope_freq_scale=1.0 / float(factor) if scaling == "linear" else 1.0,
        # llama.cpp multiplies every rope's cos and sin by the file's attn_factor (LongRoPE files have one)
        rope_mscale=float(meta(gf, a, "rope.scaling.attn_factor", 1.0) or 1.0),
    )
    if spec.swa_pattern:
        cfg = replace(cfg, rope_base_local=spec.rope_base_local, swa_pattern=spec.swa_pattern,
                      sliding_window=int(meta(gf, a, "attention.sliding_window", 0) or 0))
    if spec.softcaps:
        cap_a, cap_f = spec.softcap_defaults
        cfg = replace(cfg, attn_softcap=float(meta(gf, a, "attn_logit_softcapping", cap_a) or 0.0),
                      final_softcap=float(meta(gf, a, "final_logit_softcapping", cap_f) or 0.0))
    if spec.embed_scale:
        cfg = replace(cfg, embed_scale=float(np.sqrt(dim)))
    if spec.gemma2_scale and n_layer == 46:  # llama.cpp's rule for Gemma 2 27B (query_pre_attn_scalar)
        cfg = replace(cfg, attn_scale=float(1.0 / np.sqrt(dim / n_head)))
    if spec.moe:
        cfg = _moe_config(gf, spec, cfg)
    return cfg


def _tensor_rows(gf: GGUFFile, name: str, default: int) -> int:
    # the rows of each matrix of a 2-D or 3-D tensor (gguf shape (cols, rows[, n])), if the file has it
    t = gf.tensors.get(name)
    return int(t.shape[1]) if t is not None and len(t.shape) >= 2 else default


def _moe_config(gf: GGUFFile, spec: ArchSpec, cfg: ModelConfig) -> ModelConfig:
    a = cfg.arch
    n_expert = int(meta(gf, a, "expert_count", required=True))
    used = int(meta(gf, a, "expert_used_count", required=True))
    if not 0 < used <= n_expert:
        raise ModelLoadError(f"the file asks for {used} experts per token out of {n_expert}")
    ffn = meta(gf, a, "expert_feed_forward_length", None)
    if not ffn:  # olmoe: feed_forward_length; qwen2moe's llama.cpp default: ffn / used; else the tensor
        ffn = _tensor_rows(gf, "blk.0.ffn_gate_exps.weight", cfg.ffn_dim // used if cfg.ffn_dim else 0)
    shared = 0
    if spec.shared_expert:
        shared = meta(gf, a, "expert_shared_feed_forward_length", None) or cfg.ffn_dim
    return replace(cfg, n_expert=n_expert, n_expert_used=used, expert_ffn_dim=int(ffn), shared_ffn_dim=int(shared),
                   ffn_dim=int(shared or cfg.ffn_dim), expert_norm=spec.moe_norm_w,
                   expert_scale=float(meta(gf, a, "expert_weights_scale", 0.0) or 0.0) if spec.moe_scale_w else 0.0)


@dataclass
class LayerWeights:
    """One layer's tensors; a field the architecture does not have is None."""

    wq: object  # (n_head * head_dim, dim)
    wk: object  # (n_kv_head * head_dim, dim)
    wv: object  # (n_kv_head * v_head_dim, dim)
    wo: object  # (dim, n_head * v_head_dim)
    attn_norm: np.ndarray | None = None  # (dim,) pre_norms
    ffn_norm: np.ndarray | None = None  # (dim,)
    w_gate: object = None  # (ffn, dim): the dense FFN, or a MoE layer's shared expert
    w_up: object = None  # (ffn, dim)
    w_down: object = None  # (dim, ffn)
    q_norm: np.ndarray | None = None  # (head_dim,) qk_norm; (n_head * head_dim,) qk_norm_full
    k_norm: np.ndarray | None = None  # (head_dim,); (n_kv_head * head_dim,)
    post_attn_norm: np.ndarray | None = None  # (dim,) post_norms
    post_ffn_norm: np.ndarray | None = None  # (dim,)
    bq: np.ndarray | None = None  # (n_head * head_dim,) qkv_bias
    bk: np.ndarray | None = None  # (n_kv_head * head_dim,)
    bv: np.ndarray | None = None  # (n_kv_head * v_head_dim,)
    router: np.ndarray | None = None  # (dim, n_expert) float32, the router matrix transposed: moe
    exp_gate: list | None = None  # n_expert matrices (expert_ffn, dim)
    exp_up: list | None = None  # n_expert matrices (expert_ffn, dim)
    exp_down: list | None = None  # n_expert matrices (dim, expert_ffn)
    sh_gate: np.ndarray | None = None  # (dim,) the shared expert's gate: shared_expert


# A layer tensor: (fields, gguf tensor, "weight" or "bias", numpy shape, rows of each field). One field
# and rows None: the tensor as it is, a vector (size,) or a matrix (rows, cols). Several fields: a fused
# tensor whose rows are cut between them. "experts": a 3-D tensor (n_expert, rows, cols), one matrix each.
LayerTensor = tuple


def layer_tensors(spec: ArchSpec, cfg: ModelConfig, has=lambda tensor: False) -> list[LayerTensor]:
    """The tensors a layer of this architecture has, in load order; has(tensor) (a gguf MODEL_TENSOR) says
    whether the file holds that tensor's weight for the layer (for the optional fused q/k/v projection)."""
    d, hq, hk, hv = cfg.dim, cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim, cfg.n_kv_head * cfg.v_head_dim
    out = []
    if spec.pre_norms:
        out.append((("attn_norm",), TN.ATTN_NORM, "weight", (d,), None))
    if has(TN.ATTN_QKV):
        out.append((("wq", "wk", "wv"), TN.ATTN_QKV, "weight", (hq + hk + hv, d), (hq, hk, hv)))
    else:
        out += [(("wq",), TN.ATTN_Q, "weight", (hq, d), None), (("wk",), TN.ATTN_K, "weight", (hk, d), None),
                (("wv",), TN.ATTN_V, "weight", (hv, d), None)]
    out.append((("wo",), TN.ATTN_OUT, "weight", (d, cfg.n_head * cfg.v_head_dim), None))
    if spec.pre_norms:
        out.append((("ffn_norm",), TN.FFN_NORM, "weight", (d,), None))
    f = cfg.ffn_dim
    if spec.moe:
        e, fe = cfg.n_expert, cfg.expert_ffn_dim
        out += [(("router",), TN.FFN_GATE_INP, "weight", (e, d), "float"),
                (("exp_gate",), TN.FFN_GATE_EXP, "weight", (e, fe, d), "experts"),
                (("exp_up",), TN.FFN_UP_EXP, "weight", (e, fe, d), "experts"),
                (("exp_down",), TN.FFN_DOWN_EXP, "weight", (e, d, fe), "experts")]
        if spec.shared_expert:
            out += [(("sh_gate",), TN.FFN_GATE_INP_SHEXP, "weight", (d,), None),
                    (("w_gate",), TN.FFN_GATE_SHEXP, "weight", (f, d), None),
                    (("w_up",), TN.FFN_UP_SHEXP, "weight", (f, d), None),
                    (("w_down",), TN.FFN_DOWN_SHEXP, "weight", (d, f), None)]
    elif spec.fused_gate_up:
        out += [(("w_gate", "w_up"), TN.FFN_UP, "weight", (2 * f, d), (f, f)),
                (("w_down",), TN.FFN_DOWN, "weight", (d, f), None)]
    else:
        out += [(("w_gate",), TN.FFN_GATE, "weight", (f, d), None), (("w_up",), TN.FFN_UP, "weight", (f, d), None),
                (("w_down",), TN.FFN_DOWN, "weight", (d, f), None)]
    if spec.qk_norm or spec.qk_norm_full:
        qn, kn = (hq, hk) if spec.qk_norm_full else (cfg.head_dim, cfg.head_dim)
        out += [(("q_norm",), TN.ATTN_Q_NORM, "weight", (qn,), None), (("k_norm",), TN.ATTN_K_NORM, "weight", (kn,), None)]
    if spec.post_norms:
        out += [(("post_attn_norm",), TN.ATTN_POST_NORM, "weight", (d,), None),
                (("post_ffn_norm",), TN.FFN_POST_NORM, "weight", (d,), None)]
    if spec.qkv_bias:
        out += [(("bq",), TN.ATTN_Q, "bias", (hq,), None), (("bk",), TN.ATTN_K, "bias", (hk,), None),
                (("bv",), TN.ATTN_V, "bias", (hv,), None)]
    return out


def tensor_name(tensor: TN, part: str, layer: int) -> str:
    """gguf's name of a layer's tensor: tensor_name(TN.ATTN_Q, "weight", 3) is "blk.3.attn_q.weight"."""
    return f"{TENSOR_NAMES[tensor].format(bid=layer)}.{part}"


def load_layer(ld: WeightLoader, spec: ArchSpec, cfg: ModelConfig, i: int) -> LayerWeights:
    got = {}
    for fields, tensor, part, shape, rows in layer_tensors(spec, cfg, lambda t: ld.has(tensor_name(t, "weight", i))):
        name = tensor_name(tensor, part, i)
        if rows == "experts":
            got[fields[0]] = ld.matrix_rows(name, shape, [shape[1]] * shape[0])
        elif rows == "float":  # the router, transposed (kernels/cpu/moe.py's route)
            got[fields[0]] = np.ascontiguousarray(ld.float_matrix(name, *shape).T, dtype=np.float32)
        elif rows is not None:
            got.update(zip(fields, ld.matrix_rows(name, shape, list(rows))))
        elif len(shape) == 1:
            got[fields[0]] = ld.vector(name, *shape)
        else:
            got[fields[0]] = ld.matrix(name, *shape)
    return LayerWeights(**got)


class Model:
    """Weights plus the forward pass of a decoder architecture; every op goes through the kernel
    backend `kb`. n_ctx: the context a sequence may reach (LongRoPE files' choice of rope factors);
    None: the engine's default, the model's context capped at DEFAULT_MAX_CONTEXT."""

    def __init__(self, gf: GGUFFile, kb, spec: ArchSpec, cfg: ModelConfig | None = None, n_ctx: int | None = None):
        self.spec = spec
        self.cfg = cfg = cfg or config_from_gguf(gf, spec)
        self.kb = kb
        check_vocab(gf, cfg.vocab_size)
        if spec.moe and not hasattr(kb, "moe_route"):
            raise ModelLoadError(f"{cfg.arch} is a mixture-of-experts model: the {kb.NAME} backend cannot run "
                                 "those yet (use the CPU)")
        if cfg.rope_base_local is not None:
            self.inv_freq_local = kb.upload(rope_inv_freq(cfg.rope_dim, cfg.rope_base_local))
        ld = WeightLoader(gf, kb)
        self.tok_embd = ld.matrix("token_embd.weight", cfg.vocab_size, cfg.dim)
        self.layers = [load_layer(ld, spec, cfg, i) for i in range(cfg.n_layer)]
        self.output_norm = ld.vector("output_norm.weight", cfg.dim)
        self.output = ld.matrix("output.weight", cfg.vocab_size, cfg.dim) if ld.has("output.weight") else self.tok_embd
        factors = self._rope_factors(gf, ld, n_ctx)
        ld.finish()
        self.inv_freq = kb.upload(rope_inv_freq(cfg.rope_dim, cfg.rope_base, cfg.rope_freq_scale, factors))
        # every layer in one compiled call where the backend has one; forward_per_op is the reference
        self.stack = kb.layer_stack(cfg, self.layers, [self.layer_inv_freq(i) for i in range(cfg.n_layer)],
                                    **spec.stack_flags)

    def _rope_factors(self, gf: GGUFFile, ld: WeightLoader, n_ctx: int | None):
        # per-frequency divisors of the RoPE angles: Llama 3's rope_freqs, or LongRoPE's short or long
        # factors (long where a sequence may run past the original context, as llama.cpp chooses)
        cfg, half = self.cfg, self.cfg.rope_dim // 2
        name = "rope_freqs.weight"
        if not ld.has(name) and ld.has("rope_factors_short.weight"):
            from ..config import DEFAULT_MAX_CONTEXT

            n_ctx = n_ctx or min(cfg.context_length, DEFAULT_MAX_CONTEXT)
            orig = meta(gf, cfg.arch, "rope.scaling.original_context_length", cfg.context_length)
            self.rope_factors_used = "long" if n_ctx > orig else "short"
            name = f"rope_factors_{self.rope_factors_used}.weight"
        if not ld.has(name):
            return None
        ld.check(name, (half,))  # on the host: rope_inv_freq divides by them before the upload
        return np.array(gf.tensor(name), np.float32)

    def layer_inv_freq(self, layer: int):
        return self.inv_freq_local if self.cfg.is_sliding(layer) and self.cfg.rope_base_local is not None \
            else self.inv_freq

    def forward(self, batch: Batch, cache: KVCache, hidden: bool = False) -> np.ndarray:
        """Logits (L, vocab), on the host, for the tokens batch.logits_idx selects; hidden: their final
        hidden states after the output norm (L, dim) instead (what llama.cpp's embeddings are)."""
        if self.stack is None:
            return self.forward_per_op(batch, cache, hidden)
        rows = self.stack.run(self.embed(batch.token_ids), batch, cache)
        return self.normed(rows) if hidden else self.logits(rows)

    def embed(self, token_ids):
        x = self.kb.embed(self.tok_embd, token_ids)
        if self.spec.embed_scale:
            self.kb.scale_(x, self.cfg.embed_scale)
        return x

    def forward_per_op(self, batch: Batch, cache: KVCache, hidden: bool = False) -> np.ndarray:
        """The reference forward: one backend call per op (the CUDA backend's path)."""
        kb, cfg, spec = self.kb, self.cfg, self.spec
        batch = kb.prepare_batch(batch)
        x = self.embed(batch.token_ids)
        h = kb.empty(x.shape)
        for i, lw in enumerate(self.layers):
            if spec.pre_norms:
                kb.rmsnorm(x, lw.attn_norm, cfg.norm_eps, h)
            a = attention(kb, cfg, spec, i, lw, h if spec.pre_norms else x, batch, cache, self.layer_inv_freq(i))
            if spec.post_norms:
                kb.rmsnorm(a, lw.post_attn_norm, cfg.norm_eps, a)
            kb.add_(x, a)
            if spec.pre_norms:
                kb.rmsnorm(x, lw.ffn_norm, cfg.norm_eps, h)
            f = (moe_ffn if spec.moe else dense_ffn)(kb, cfg, spec, lw, h if spec.pre_norms else x)
            if spec.post_norms:
                kb.rmsnorm(f, lw.post_ffn_norm, cfg.norm_eps, f)
            kb.add_(x, f)
        rows = kb.take_rows(x, batch.logits_idx)
        return self.normed(rows) if hidden else self.logits(rows)

    def normed(self, x) -> np.ndarray:
        """Hidden states after the output norm, on the host."""
        h = self.kb.empty(x.shape)
        self.kb.rmsnorm(x, self.output_norm, np.float32(self.cfg.norm_eps), h)
        return self.kb.to_host(h)

    def logits(self, x) -> np.ndarray:
        kb, cfg = self.kb, self.cfg
        h = kb.empty(x.shape)
        kb.rmsnorm(x, self.output_norm, np.float32(cfg.norm_eps), h)  # float32 eps: the step's own rmsnorm
        out = kb.matmul(self.output, h)
        if cfg.final_softcap > 0:
            kb.softcap(out, np.float32(cfg.final_softcap))
        return kb.to_host(out)


def dense_ffn(kb, cfg: ModelConfig, spec: ArchSpec, lw: LayerWeights, h, w_gate=None, w_up=None, w_down=None):
    """The gated FFN of h (T, dim): down(act(gate h) * up h), with the layer's (or the given) matrices."""
    act = kb.gelu_tanh_mul if spec.activation == "gelu_tanh" else kb.silu_mul
    hq = kb.quantize_input(h)  # one quantized activation for gate and up
    if w_gate is None:
        w_gate, w_up, w_down = lw.w_gate, lw.w_up, lw.w_down
    g = kb.matmul(w_gate, hq)
    act(g, kb.matmul(w_up, hq), g)
    return kb.matmul(w_down, g)


def moe_ffn(kb, cfg: ModelConfig, spec: ArchSpec, lw: LayerWeights, h):
    """The mixture-of-experts FFN of h (T, dim) (kernels/cpu/moe.py has the steps): the router's k
    experts per token, each expert's tokens through its FFN together, the weighted sum; plus the shared
    expert, gated, where the architecture has one."""
    t, k = h.shape[0], cfg.n_expert_used
    ids, wts = kb.moe_route(h, lw.router, k, cfg.expert_norm, cfg.expert_scale)
    offsets, order, pos = kb.moe_plan(ids, cfg.n_expert)
    hs = kb.take_rows(h, order)  # (T * k, dim): each expert's tokens one run of rows
    y = kb.empty((t * k, cfg.dim))
    for e in np.flatnonzero(np.diff(offsets)):  # the experts some token chose
        r0, r1 = int(offsets[e]), int(offsets[e + 1])
        y[r0:r1] = dense_ffn(kb, cfg, spec, lw, hs[r0:r1], lw.exp_gate[e], lw.exp_up[e], lw.exp_down[e])
    out = kb.empty(h.shape)
    kb.moe_combine(y, pos, wts, out)
    if spec.shared_expert:
        kb.moe_shared_add(out, dense_ffn(kb, cfg, spec, lw, h), h, lw.sh_gate)
    return out


def attention(kb, cfg: ModelConfig, spec: ArchSpec, layer: int, lw: LayerWeights, h, batch: Batch,
              cache: KVCache, inv_freq) -> np.ndarray:
    """Self-attention of one layer for the batch: h (T, dim) -> (T, dim)."""
    t = h.shape[0]
    hq = kb.quantize_input(h)  # one quantized activation for q, k and v
    q2, k2, v2 = kb.matmul(lw.wq, hq), kb.matmul(lw.wk, hq), kb.matmul(lw.wv, hq)
    if spec.qkv_bias:
        kb.add_bias_(q2, lw.bq)
        kb.add_bias_(k2, lw.bk)
        kb.add_bias_(v2, lw.bv)
    if spec.qk_norm_full:  # over each token's whole projection
        kb.rmsnorm(q2, lw.q_norm, cfg.norm_eps, q2)
        kb.rmsnorm(k2, lw.k_norm, cfg.norm_eps, k2)
    q = q2.reshape(t, cfg.n_head, cfg.head_dim)
    k = k2.reshape(t, cfg.n_kv_head, cfg.head_dim)
    v = v2.reshape(t, cfg.n_kv_head, cfg.v_head_dim)
    if spec.qk_norm:
        qf = q.reshape(t * cfg.n_head, cfg.head_dim)
        kf = k.reshape(t * cfg.n_kv_head, cfg.head_dim)
        kb.rmsnorm(qf, lw.q_norm, cfg.norm_eps, qf)
        kb.rmsnorm(kf, lw.k_norm, cfg.norm_eps, kf)
    qr, kr = (q[:, :, : cfg.rope_dim], k[:, :, : cfg.rope_dim]) if cfg.rope_dim < cfg.head_dim else (q, k)
    kb.rope(qr, batch.positions, inv_freq, cfg.rope_neox, cfg.rope_mscale)
    kb.rope(kr, batch.positions, inv_freq, cfg.rope_neox, cfg.rope_mscale)
    kc, vc = cache.k[layer], cache.v[layer]
    kb.write_kv(kb.kv_store(k, cache.dtype), kb.kv_store(v, cache.dtype), batch.slot_mapping, kc, vc)
    out = kb.empty((t, cfg.n_head, cfg.v_head_dim))
    scale = cfg.attn_scale if cfg.attn_scale is not None else 1.0 / np.sqrt(cfg.head_dim)
    window = cfg.sliding_window if cfg.is_sliding(layer) else 0
    kb.paged_attention(q, kc, vc, batch.token_seq, batch.positions, batch.block_tables, cache.block_size,
                       np.float32(scale), window, np.float32(cfg.attn_softcap), out)
    return kb.matmul(lw.wo, out.reshape(t, cfg.n_head * cfg.v_head_dim))


__all__ = ["ArchSpec", "LayerWeights", "Model", "attention", "config_from_gguf", "dense_ffn", "layer_tensors",
           "load_layer", "moe_ffn"]
