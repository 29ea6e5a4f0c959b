"""The decoder-only transformer every generative architecture here is, read from an ArchSpec.

An architecture module (llama.py, gemma3.py, qwen2.py) declares its SPEC: what its layer has beyond the
plain llama layer (pre-norm, RoPE, GQA attention, a SiLU-gated FFN). This module reads the spec three
times, and nowhere else is an architecture's shape stated:
- `config_from_gguf`: the GGUF metadata into a ModelConfig;
- `load_layer`: which tensors a layer has, under gguf's own tensor names (gguf.TENSOR_NAMES);
- `Model`: `forward_per_op`, the readable reference (one backend call per op, the CUDA backend's path),
  and the compiled step (kernels/cpu/step.py), which takes the spec's switches as flags.
A layer is a sequence of parts (models/parts/: norms, the attention mixer, the dense or expert FFN), each
part's tensors and per-op code in a module of its own. Adding a llama-family architecture is a spec plus
any op it genuinely adds; tests hold the compiled step to forward_per_op.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
from gguf.constants import MODEL_TENSOR as TN
from gguf.constants import TENSOR_NAMES

from ..config import ModelConfig
from ..gguf_file import GGUFFile
from . import parts
from .common import ModelLoadError, WeightLoader, check_vocab, meta, rope_inv_freq
from .parts import norms

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
    # recurrent layers: the mixer ("shortconv": LFM2's gated short convolution; "mamba2") of every layer
    # whose attention.head_count_kv entry is 0 (every layer where attention.head_count is 0); "": none
    recurrent: str = ""
    feed_forward: bool = True  # a feed-forward block in every layer (Mamba2 has none)
    output_norm: str = "output_norm"  # the final norm's tensor (LFM2's is token_embd_norm)
    # a layer is one block of one kind (Nemotron-H): mixer `recurrent` where head_count_kv and
    # feed_forward_length (per layer) are both 0, attention where only the latter is, else a feed-forward
    # block alone ("mlp": up, ReLU squared, down)
    mlp_layers: bool = False
    rope: bool = True  # RoPE in the attention layers; False: none (NoPE)
    # Granite's multipliers from the metadata (embedding_scale, residual_scale, attention.scale,
    # logit_scale), and RoPE only where rope.scaling.finetuned is true (Granite 4 H files: false)
    granite: bool = False
    # the spec's changes (field, value) for a file with experts (expert_count > 0: Granite 4 H Tiny/Small);
    # a shared expert where the file gives expert_shared_feed_forward_length
    with_experts: tuple = ()
    shared_gate: bool = True  # the shared expert's output gated by sigmoid(h . sh_gate) (qwen2moe); else added
    attn_gate: bool = False  # attn_q holds each head's query then its gate: the output times sigmoid(gate) (qwen35)
    ffn_norm: TN = TN.FFN_NORM  # the norm before the feed-forward block (qwen35: post_attention_norm)
    imrope: bool = False  # the file's rope.dimension_sections (interleaved multi-section RoPE, qwen35)
    # Qwen3-Next's delta net: beta and alpha in one ssm_ba grouped by key head, value head h reading key head
    # h // (H / Hk); else Qwen3.5's (ssm_beta and ssm_alpha, key head h % Hk)
    delta_next: bool = False

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")

    @property
    def stack_flags(self) -> dict:
        """The compiled step's switches (kernels.cpu.step.LayerStack)."""
        return {"qk_norm": 2 if self.qk_norm_full else int(self.qk_norm), "post_norms": self.post_norms,
                "gelu": self.activation == "gelu_tanh", "qkv_bias": self.qkv_bias, "pre_norms": self.pre_norms,
                "moe": self.moe, "shared_expert": self.shared_expert}


def resolve(gf: GGUFFile, spec: ArchSpec) -> ArchSpec:
    """The spec of this file: spec.with_experts applied where the file has experts."""
    a = gf.architecture
    if spec.with_experts and meta(gf, a, "expert_count", 0):
        spec = replace(spec, **dict(spec.with_experts))
        if spec.shared_expert:  # a shared expert is there where the file sizes one
            spec = replace(spec, shared_expert=bool(meta(gf, a, "expert_shared_feed_forward_length", 0)))
    return spec


def config_from_gguf(gf: GGUFFile, spec: ArchSpec) -> ModelConfig:
    a = gf.architecture
    dim = meta(gf, a, "embedding_length", required=True)
    n_head = meta(gf, a, "attention.head_count", required=True)
    head_dim = meta(gf, a, "attention.key_length", dim // n_head if n_head else 0)
    emb = gf.tensors.get("token_embd.weight")
    if emb is None:
        raise ModelLoadError("missing tensor 'token_embd.weight'")
    scaling = meta(gf, a, "rope.scaling.type", "none")
    factor = meta(gf, a, "rope.scaling.factor", 1.0) or 1.0
    if scaling not in (*ROPE_SCALINGS, None):
        raise ModelLoadError(f"rope scaling type {scaling!r} is not supported (supported: {', '.join(ROPE_SCALINGS)})")
    n_layer = meta(gf, a, "block_count", required=True)
    mixers, n_kv_head = _layer_mixers(gf, spec, n_layer, n_head)
    cfg = ModelConfig(
        arch=a,
        n_layer=n_layer,
        dim=dim,
        n_head=n_head,
        n_kv_head=n_kv_head,
        head_dim=head_dim,
        v_head_dim=meta(gf, a, "attention.value_length", head_dim),
        ffn_dim=(max(_per_layer(gf, "feed_forward_length", n_layer)) if spec.mlp_layers
                 else meta(gf, a, "feed_forward_length", required=not spec.moe) or 0),
        vocab_size=int(emb.shape[1]),
        context_length=meta(gf, a, "context_length", 2048),
        # Nemotron-H's llama.cpp falls back to the layer-norm epsilon
        norm_eps=float(meta(gf, a, "attention.layer_norm_rms_epsilon", meta(gf, a, "attention.layer_norm_epsilon", 1e-5))),
        rope_base=float(meta(gf, a, "rope.freq_base", 10000.0)),
        rope_dim=meta(gf, a, "rope.dimension_count", head_dim),
        rope_neox=spec.rope_neox,
        rope_freq_scale=1.0 / float(factor) if scaling == "linear" else 1.0,
        # llama.cpp multiplies every rope's cos and sin by the file's attn_factor (LongRoPE files have one)
        rope_mscale=float(meta(gf, a, "rope.scaling.attn_factor", 1.0) or 1.0),
    )
    if mixers:
        cfg = _recurrent_config(gf, spec, replace(cfg, mixers=mixers))
    if spec.swa_pattern:
        cfg = replace(cfg, rope_base_local=spec.rope_base_local, swa_pattern=spec.swa_pattern,
                      sliding_window=int(meta(gf, a, "attention.sliding_window", 0) or 0))
    if spec.softcaps:
        cap_a, cap_f = spec.softcap_defaults
        cfg = replace(cfg, attn_softcap=float(meta(gf, a, "attn_logit_softcapping", cap_a) or 0.0),
                      final_softcap=float(meta(gf, a, "final_logit_softcapping", cap_f) or 0.0))
    if spec.embed_scale:
        cfg = replace(cfg, embed_scale=float(np.sqrt(dim)))
    if spec.imrope:
        cfg = replace(cfg, rope_sections=_rope_sections(gf, cfg))
    if not spec.rope or (spec.granite and not meta(gf, a, "rope.scaling.finetuned", True)):
        cfg = replace(cfg, rope=False)
    if spec.granite:
        cfg = _granite_config(gf, cfg)
    if spec.gemma2_scale and n_layer == 46:  # llama.cpp's rule for Gemma 2 27B (query_pre_attn_scalar)
        cfg = replace(cfg, attn_scale=float(1.0 / np.sqrt(dim / n_head)))
    if spec.moe:
        cfg = _moe_config(gf, spec, cfg)
    return cfg


def _rope_sections(gf: GGUFFile, cfg: ModelConfig) -> tuple:
    key = f"{cfg.arch}.rope.dimension_sections"
    v = gf.metadata.get(key)
    if v is None:
        raise ModelLoadError(f"missing metadata key {key!r}")
    sections = tuple(int(x) for x in (list(v) + [0, 0, 0, 0])[:4])
    if not 0 < sum(sections) <= cfg.rope_dim // 2 or min(sections) < 0:
        raise ModelLoadError(f"metadata key {key!r} is {list(v)}: its sections must add up to between 1 and "
                             f"{cfg.rope_dim // 2} (half the rotated dimensions)")
    return sections


def imrope_pairs(sections: tuple, n_pairs: int) -> np.ndarray:
    """Which of n_pairs rotated pairs a text token rotates under interleaved multi-section RoPE (llama.cpp's
    ggml_mrope_cache_init with is_imrope: a pair of the fourth section takes the fourth position, which is 0
    for text)."""
    total = sum(sections)
    keep = np.ones(n_pairs, bool)
    for i in range(n_pairs):
        s = i % total
        keep[i] = (s % 3 == 1 and s < 3 * sections[1]) or (s % 3 == 2 and s < 3 * sections[2]) \
            or (s % 3 == 0 and s < 3 * sections[0])
    return keep


def _granite_config(gf: GGUFFile, cfg: ModelConfig) -> ModelConfig:
    # Granite's multipliers, float32 as llama.cpp reads them (0 or absent: none)
    a = cfg.arch
    f32 = lambda key: float(np.float32(meta(gf, a, key, 0.0) or 0.0))  # noqa: E731
    cfg = replace(cfg, residual_scale=f32("residual_scale"), logit_scale=f32("logit_scale"))
    if f32("embedding_scale"):
        cfg = replace(cfg, embed_scale=f32("embedding_scale"))
    if f32("attention.scale"):
        cfg = replace(cfg, attn_scale=f32("attention.scale"))
    return cfg


def _layer_mixers(gf: GGUFFile, spec: ArchSpec, n_layer: int, n_head: int) -> tuple[tuple, int]:
    """(each layer's mixer, or () where every layer is attention; the attention layers' KV heads). A hybrid
    file (spec.recurrent) gives head_count_kv per layer, 0 for a recurrent layer (a qwen35 file says which
    layers are linear attention apart); a state-space model's head_count is 0."""
    key = f"{gf.architecture}.attention.head_count_kv"
    if not spec.recurrent:
        return (), meta(gf, gf.architecture, "attention.head_count_kv", n_head)
    if spec.recurrent == "deltanet":  # Qwen3.5: one head_count_kv; which layers are which said apart
        return (tuple(spec.recurrent if r else "attention" for r in _deltanet_layers(gf, n_layer)),
                meta(gf, gf.architecture, "attention.head_count_kv", n_head))
    per = _per_layer(gf, "attention.head_count_kv", n_layer) if key in gf.metadata else [n_head] * n_layer
    heads = sorted({h for h in per if h})
    if len(heads) > 1:
        raise ModelLoadError(f"metadata key {key!r} gives different KV head counts ({heads}) to the attention layers; "
                             "edgeinfer supports one")
    mixers = ["attention" if h else spec.recurrent for h in per]
    if spec.mlp_layers:  # Nemotron-H: a layer with a feed-forward length is a feed-forward block alone
        ffn = _per_layer(gf, "feed_forward_length", n_layer)
        mixers = ["mlp" if f else m for m, f in zip(mixers, ffn)]
        sizes = sorted({f for f in ffn if f})
        if len(sizes) > 1:
            raise ModelLoadError(f"metadata key '{gf.architecture}.feed_forward_length' gives different sizes "
                                 f"({sizes}) to the feed-forward layers; edgeinfer supports one")
    return tuple(mixers), (heads[0] if heads else n_head)


def _deltanet_layers(gf: GGUFFile, n_layer: int) -> list[bool]:
    # which layers are linear attention: attention.recurrent_layers (one bool a layer), else all but every
    # full_attention_interval-th (llama.cpp's default interval: 4)
    a = gf.architecture
    v = gf.metadata.get(f"{a}.attention.recurrent_layers")
    if v is not None:
        flags = [bool(x) for x in v]
        if len(flags) < n_layer:
            raise ModelLoadError(f"metadata key '{a}.attention.recurrent_layers' has {len(flags)} values for {n_layer} layers")
        return flags[:n_layer]
    interval = int(meta(gf, a, "full_attention_interval", 4) or 0)
    if interval < 1:
        raise ModelLoadError(f"metadata key '{a}.full_attention_interval' is {interval}: it must be at least 1")
    return [(i + 1) % interval != 0 for i in range(n_layer)]


def _per_layer(gf: GGUFFile, key: str, n_layer: int) -> list[int]:
    # a metadata value given once or per layer, as one int per layer
    name = f"{gf.architecture}.{key}"
    v = gf.metadata.get(name, 0)
    per = [int(x) for x in v] if isinstance(v, (list, np.ndarray)) else [int(v)] * n_layer
    if len(per) != n_layer:
        raise ModelLoadError(f"metadata key {name!r} has {len(per)} values for {n_layer} layers")
    return per


def _recurrent_config(gf: GGUFFile, spec: ArchSpec, cfg: ModelConfig) -> ModelConfig:
    # the recurrent layers' sizes, checked
    a = cfg.arch
    if meta(gf, a, "attention.sliding_window", 0):
        raise ModelLoadError(f"{a} with sliding-window attention layers is not supported yet")
    if spec.recurrent == "shortconv":
        cfg = replace(cfg, conv_l_cache=int(meta(gf, a, "shortconv.l_cache", required=True)))
        if cfg.conv_l_cache < 2:
            raise ModelLoadError(f"{a}.shortconv.l_cache is {cfg.conv_l_cache}: a short convolution needs at least 2 taps")
        return cfg
    cfg = replace(cfg, ssm_conv=int(meta(gf, a, "ssm.conv_kernel", required=True)),
                  ssm_inner=int(meta(gf, a, "ssm.inner_size", required=True)),
                  ssm_state=int(meta(gf, a, "ssm.state_size", required=True)),
                  ssm_heads=int(meta(gf, a, "ssm.time_step_rank", required=True)),
                  ssm_groups=int(meta(gf, a, "ssm.group_count", 1) or 1))
    if cfg.ssm_conv < 2:
        raise ModelLoadError(f"{a}.ssm.conv_kernel is {cfg.ssm_conv}: a convolution needs at least 2 taps")
    if spec.recurrent == "deltanet" and (cfg.ssm_heads % cfg.ssm_groups or cfg.ssm_inner != cfg.ssm_heads * cfg.ssm_state):
        raise ModelLoadError(f"{a}: ssm.inner_size {cfg.ssm_inner} must be ssm.time_step_rank {cfg.ssm_heads} value heads "
                             f"of ssm.state_size {cfg.ssm_state}, and the value heads a multiple of ssm.group_count "
                             f"{cfg.ssm_groups}")
    if min(cfg.ssm_inner, cfg.ssm_state, cfg.ssm_heads) < 1 or cfg.ssm_inner % cfg.ssm_heads \
            or cfg.ssm_heads % cfg.ssm_groups:
        raise ModelLoadError(f"{a}: ssm.inner_size {cfg.ssm_inner} must be a multiple of ssm.time_step_rank "
                             f"{cfg.ssm_heads}, and that of ssm.group_count {cfg.ssm_groups}")
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

    wq: object = None  # (n_head * head_dim, dim): an attention layer's
    wk: object = None  # (n_kv_head * head_dim, dim)
    wv: object = None  # (n_kv_head * v_head_dim, dim)
    wo: object = None  # (dim, n_head * v_head_dim)
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
    conv_in: object = None  # (3 dim, dim): a short-convolution layer's input projection (b, c, x),
    conv_w: np.ndarray | None = None  # (l_cache, dim) float32: its taps, transposed
    conv_out: object = None  # (dim, dim): its output projection
    ssm_in: object = None  # Mamba2: (d_inner + conv channels + heads, dim), the input projection (z, xBC, dt);
    # older Qwen3-Next files: q, k, v and z grouped by key head
    ssm_conv1d: np.ndarray | None = None  # (d_conv, conv channels) float32: the convolution's taps, transposed
    ssm_conv1d_b: np.ndarray | None = None  # (conv channels,)
    ssm_dt_b: np.ndarray | None = None  # (heads,)
    ssm_a: np.ndarray | None = None  # (heads,): the decays (-exp(A_log))
    ssm_d: np.ndarray | None = None  # (heads,): the skips
    ssm_norm: np.ndarray | None = None  # (d_inner,): the grouped RMS norm's weights
    ssm_out: object = None  # (dim, d_inner)
    ssm_qkv: object = None  # a delta net's: (2 Hk Dk + H Dv, dim), q, k and v
    ssm_z: object = None  # (H Dv, dim): the output gate
    ssm_beta: object = None  # (H, dim)
    ssm_alpha: object = None  # (H, dim)
    ssm_ba: object = None  # (2 H, dim): Qwen3-Next's beta and alpha, grouped by key head


LayerTensor = parts.LayerTensor


def layer_tensors(spec: ArchSpec, cfg: ModelConfig, has=lambda tensor: False, layer: int = 0) -> list[LayerTensor]:
    """The tensors layer `layer` of this architecture has, in load order: each residual block's pre-norm,
    part and post-norm (models/parts/); has(tensor) (a gguf MODEL_TENSOR) says whether the file holds that
    tensor's weight for the layer (for the optional fused q/k/v projection)."""
    out = []
    blocks = (("mixer", parts.mixer(cfg, layer)), ("ffn", parts.feed_forward(spec, layer)))
    for block, part in blocks[:2 if spec.feed_forward else 1]:
        out += [*norms.pre(spec, cfg, block), *part.tensors(spec, cfg, has), *norms.post(spec, cfg, block)]
    return out


def tensor_name(tensor: TN, part: str, layer: int) -> str:
    """gguf's name of a layer's tensor: tensor_name(TN.ATTN_Q, "weight", 3) is "blk.3.attn_q.weight"; part
    "": no suffix (Mamba's ssm_a, ssm_d)."""
    name = TENSOR_NAMES[tensor].format(bid=layer)
    return f"{name}.{part}" if part else name


def load_layer(ld: WeightLoader, spec: ArchSpec, cfg: ModelConfig, i: int) -> LayerWeights:
    got = {}
    for fields, tensor, part, shape, rows in layer_tensors(spec, cfg, lambda t: ld.has(tensor_name(t, "weight", i)), i):
        name = tensor_name(tensor, part, i)
        if rows == "experts":
            got[fields[0]] = ld.matrix_rows(name, shape, [shape[1]] * shape[0])
        elif rows == "float":  # the router (kernels/cpu/moe.py's route), a convolution's taps: transposed
            got[fields[0]] = np.ascontiguousarray(ld.float_matrix(name, *shape).T, dtype=np.float32)
        elif rows == "flat":  # a float 2-D tensor read as one vector (Mamba2's A, D and group norm)
            got[fields[0]] = np.ascontiguousarray(ld.float_matrix(name, *shape).reshape(-1), dtype=np.float32)
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
        if cfg.recurrent and not hasattr(kb, "ssm_scan"):
            raise ModelLoadError(f"{cfg.arch} has recurrent layers ({spec.recurrent}): the {kb.NAME} backend cannot "
                                 "run those yet (use the CPU)")
        if cfg.rope_base_local is not None:
            self.inv_freq_local = kb.upload(rope_inv_freq(cfg.rope_dim, cfg.rope_base_local))
        ld = WeightLoader(gf, kb)
        self.tok_embd = ld.matrix("token_embd.weight", cfg.vocab_size, cfg.dim)
        self.layers = [load_layer(ld, spec, cfg, i) for i in range(cfg.n_layer)]
        self.output_norm = ld.vector(f"{spec.output_norm}.weight", cfg.dim)
        self.output = ld.matrix("output.weight", cfg.vocab_size, cfg.dim) if ld.has("output.weight") else self.tok_embd
        factors = self._rope_factors(gf, ld, n_ctx)
        ld.finish()
        inv_freq = rope_inv_freq(cfg.rope_dim, cfg.rope_base, cfg.rope_freq_scale, factors)
        if cfg.rope_sections:  # IMRoPE: the fourth section's pairs keep angle 0 for text
            inv_freq = np.where(imrope_pairs(cfg.rope_sections, inv_freq.shape[0]), inv_freq, 0.0)
        self.inv_freq = kb.upload(inv_freq)
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
        if self.cfg.embed_scale != 1.0:  # Gemma's sqrt(dim), Granite's embedding_scale
            self.kb.scale_(x, self.cfg.embed_scale)
        return x

    def forward_per_op(self, batch: Batch, cache: KVCache, hidden: bool = False) -> np.ndarray:
        """The reference forward: one backend call per op (the CUDA backend's path)."""
        kb, cfg, spec = self.kb, self.cfg, self.spec
        batch = kb.prepare_batch(batch)
        x = self.embed(batch.token_ids)
        h = kb.empty(x.shape)
        for i, lw in enumerate(self.layers):  # two residual blocks a layer: the mixer's, the feed-forward's
            at = parts.Where(i, batch, cache, self.layer_inv_freq(i))
            parts.residual(kb, cfg, spec, parts.mixer(cfg, i), lw, x, h, lw.attn_norm, lw.post_attn_norm, at)
            if spec.feed_forward:
                parts.residual(kb, cfg, spec, parts.feed_forward(spec, i), lw, x, h, lw.ffn_norm, lw.post_ffn_norm,
                               at)
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
        if cfg.logit_scale:  # Granite: llama.cpp scales by the float32 1 / logit_scale
            kb.scale_(out, np.float32(1.0) / np.float32(cfg.logit_scale))
        if cfg.final_softcap > 0:
            kb.softcap(out, np.float32(cfg.final_softcap))
        return kb.to_host(out)


__all__ = ["ArchSpec", "LayerWeights", "Model", "config_from_gguf", "layer_tensors", "load_layer"]
