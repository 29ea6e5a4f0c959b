"""The GGUF metadata of a decoder architecture into its ModelConfig, read as its ArchSpec says (decoder.py):
the sizes, RoPE and its variants (scaling, IMRoPE sections), which mixer each layer has (attention, or a
hybrid model's recurrent layers, by head_count_kv, recurrent_layers or full_attention_interval), the
recurrent layers' sizes, the mixture of experts, Granite's multipliers. A value the runtime cannot honour
is a ModelLoadError naming the key."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from ..config import ModelConfig
from ..gguf_file import GGUFFile
from .common import ModelLoadError, meta

if TYPE_CHECKING:
    from .decoder import ArchSpec

# rope.scaling.type values that are supported ("longrope": the rope_factors_short/long tensors, chosen
# by the context length, as llama.cpp does)
ROPE_SCALINGS = ("none", "linear", "longrope", "yarn")


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
        ffn_dim=(max(_per_layer(gf, "feed_forward_length", n_layer)) if spec.mlp_layers or spec.layer_shapes
                 else meta(gf, a, "feed_forward_length", required=not spec.moe) or 0),
        vocab_size=int(emb.shape[1]),
        context_length=meta(gf, a, "context_length", 2048),
        # Nemotron-H's llama.cpp falls back to the layer-norm epsilon
        norm_eps=float(meta(gf, a, "attention.layer_norm_rms_epsilon", meta(gf, a, "attention.layer_norm_epsilon", 1e-5))),
        rope_base=float(meta(gf, a, "rope.freq_base", 10000.0)),
        rope_dim=meta(gf, a, "rope.dimension_count", head_dim),
        rope_neox=spec.rope_neox,
        rope_freq_scale=1.0 / float(factor) if scaling in ("linear", "yarn") else 1.0,
        # llama.cpp multiplies every rope's cos and sin by the file's attn_factor (LongRoPE files have one)
        rope_mscale=float(meta(gf, a, "rope.scaling.attn_factor", 1.0) or 1.0),
    )
    if mixers:
        cfg = _recurrent_config(gf, spec, replace(cfg, mixers=mixers))
    swa_base = meta(gf, a, "rope.freq_base_swa", None)
    if spec.swa_pattern and not spec.layer_shapes and spec.rope_base_local is None and swa_base is not None and float(swa_base) != cfg.rope_base:
        raise ModelLoadError(f"{a}.rope.freq_base_swa ({swa_base}) differs from {a}.rope.freq_base ({cfg.rope_base}): "
                             "sliding-window layers with a RoPE base of their own are not supported for this architecture")
    if spec.swa_pattern:
        cfg = replace(cfg, rope_base_local=spec.rope_base_local, swa_pattern=spec.swa_pattern,
                      sliding_window=int(meta(gf, a, "attention.sliding_window", 0) or 0))
    if spec.layer_shapes:
        cfg = _layer_shapes_config(gf, spec, cfg)
    if spec.softcaps:
        cap_a, cap_f = spec.softcap_defaults
        cfg = replace(cfg, attn_softcap=float(meta(gf, a, "attn_logit_softcapping", cap_a) or 0.0),
                      final_softcap=float(meta(gf, a, "final_logit_softcapping", cap_f) or 0.0))
    if spec.embed_scale:
        cfg = replace(cfg, embed_scale=float(np.sqrt(dim)))
    if spec.imrope:
        cfg = replace(cfg, rope_sections=_rope_sections(gf, cfg))
    if spec.nope_interval:
        cfg = replace(cfg, nope_interval=spec.nope_interval)
    orig = int(meta(gf, a, "rope.scaling.original_context_length", 0) or cfg.context_length)
    if scaling == "yarn" and (orig <= 0 or factor <= 0):
        raise ModelLoadError(f"YaRN RoPE scaling needs a positive {a}.rope.scaling.factor and "
                             f"{a}.rope.scaling.original_context_length, got {factor} and {orig}")
    if scaling == "yarn":
        cfg = _yarn_config(gf, cfg, orig)
    if spec.attn_temp and float(meta(gf, a, "attention.temperature_scale", 0.0) or 0.0):
        cfg = replace(cfg, attn_temp=(float(np.float32(meta(gf, a, "attention.temperature_scale"))), float(orig)))
    if not spec.rope or (spec.granite and not meta(gf, a, "rope.scaling.finetuned", True)):
        cfg = replace(cfg, rope=False)
    if spec.granite:
        cfg = _granite_config(gf, cfg)
    if spec.altup:  # Gemma 3n
        n, act = int(meta(gf, a, "altup.num_inputs", 4)), int(meta(gf, a, "altup.active_idx", 0))
        lt = gf.tensors.get("blk.0.laurel_l.weight")
        if n < 2 or not 0 <= act < n or lt is None or len(lt.shape) != 2:
            raise ModelLoadError(f"{a}.altup.num_inputs {n} and altup.active_idx {act} (at least 2 streams, the "
                                 "active one among them), and a blk.0.laurel_l.weight matrix, are needed")
        if cfg.per_layer_dim <= 0:
            raise ModelLoadError(f"{a}.embedding_length_per_layer_input is {cfg.per_layer_dim}: Gemma 3n's layers "
                                 "need their per-layer inputs")
        cfg = replace(cfg, altup=n, altup_active=act, laurel_rank=int(lt.shape[1]))
    if spec.attn_scale_one:  # Gemma 4: q and k are RMS-normed, the scores not scaled
        cfg = replace(cfg, attn_scale=1.0)
    if spec.gemma2_scale and n_layer == 46:  # llama.cpp's rule for Gemma 2 27B (query_pre_attn_scalar)
        cfg = replace(cfg, attn_scale=float(1.0 / np.sqrt(dim / n_head)))
    if spec.moe or spec.gemma4_moe:
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


def _yarn_config(gf: GGUFFile, cfg: ModelConfig, orig: int) -> ModelConfig:
    # llama.cpp's YaRN (llama-context.cpp, ggml's rope_yarn): with ext_factor 1, cos and sin times
    # get_mscale(factor, 1) (or its ratio to get_mscale(factor, yarn_log_multiplier)) and the file's attn_factor
    a, f32 = cfg.arch, np.float32
    factor = f32(1.0) / f32(cfg.rope_freq_scale)
    log_mul = f32(meta(gf, a, "rope.scaling.yarn_log_multiplier", 0.0) or 0.0)
    mscale = lambda m: f32(1.0) if factor <= 1 else f32(0.1) * f32(m) * np.log(factor) + f32(1.0)  # noqa: E731
    m = mscale(1.0) / mscale(log_mul) if log_mul else mscale(1.0)
    beta_fast = float(meta(gf, a, "rope.scaling.yarn_beta_fast", 32.0) or 32.0)
    beta_slow = float(meta(gf, a, "rope.scaling.yarn_beta_slow", 1.0) or 1.0)
    return replace(cfg, rope_yarn=(orig, beta_fast, beta_slow), rope_mscale=float(f32(m) * f32(cfg.rope_mscale)))


def yarn_mix(cfg: ModelConfig) -> np.ndarray:
    """YaRN's per-pair multiplier of the original angles: freq_scale below the correction range, 1 above it,
    a linear ramp between (ggml's rope_yarn_corr_dims and rope_yarn_ramp, in float32 as ggml computes them)."""
    orig, beta_fast, beta_slow = cfg.rope_yarn
    n, f32 = cfg.rope_dim, np.float32
    corr = lambda beta: f32(n) * np.log(f32(orig) / (f32(beta) * f32(2 * np.pi))) / (f32(2) * np.log(f32(cfg.rope_base)))  # noqa: E731
    low, high = max(0.0, float(np.floor(corr(beta_fast)))), min(n - 1.0, float(np.ceil(corr(beta_slow))))
    y = (np.arange(n // 2, dtype=np.float32) - f32(low)) / f32(max(0.001, high - low))
    ramp = f32(1) - np.minimum(f32(1), np.maximum(f32(0), y))
    fs = f32(cfg.rope_freq_scale)
    return (fs * (f32(1) - ramp) + ramp).astype(np.float64)


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
        if spec.layer_shapes and key in gf.metadata:  # Gemma 4: given per layer (set apart by at())
            return (), max(_per_layer(gf, "attention.head_count_kv", n_layer))
        return (), meta(gf, gf.architecture, "attention.head_count_kv", n_head)
    if spec.recurrent == "attn_mamba2":  # Falcon-H1: attention and Mamba2 in every layer
        return (spec.recurrent,) * n_layer, meta(gf, gf.architecture, "attention.head_count_kv", n_head)
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


def _layer_shapes_config(gf: GGUFFile, spec: ArchSpec, cfg: ModelConfig) -> ModelConfig:
    # Gemma 4's layers: sliding-window ones (attention.sliding_window_pattern, one bool a layer) with their own
    # head size, rotated dimensions and RoPE base, head counts and FFN widths per layer, and the last
    # attention.shared_kv_layers layers reading the KV of the last earlier layer of their kind (llama.cpp's rule)
    a, n = cfg.arch, cfg.n_layer
    key = f"{a}.attention.sliding_window_pattern"
    pattern = gf.metadata.get(key, spec.swa_pattern or None)  # (Gemma 3n: every fifth layer global without it)
    if isinstance(pattern, (int, np.integer)) and not isinstance(pattern, bool) and pattern > 0:
        pattern = [(i + 1) % int(pattern) != 0 for i in range(n)]
    if not isinstance(pattern, (list, np.ndarray)) or len(pattern) != n:
        raise ModelLoadError(f"metadata key {key!r} must give one bool for each of the {n} layers")
    sliding = tuple(bool(x) for x in pattern)
    window = int(meta(gf, a, "attention.sliding_window", 0) or 0)
    if any(sliding) and window <= 0:
        raise ModelLoadError(f"{key!r} marks sliding-window layers but {a}.attention.sliding_window is {window}: "
                             "it must be the window's length")
    # the sliding-window layers' head sizes: their own in Gemma 4's files, the others' in Gemma 3n's
    swa_dims = (int(meta(gf, a, "attention.key_length_swa", cfg.head_dim)),
                int(meta(gf, a, "attention.value_length_swa", cfg.v_head_dim)))
    rot_swa = int(meta(gf, a, "rope.dimension_count_swa", swa_dims[0] if swa_dims[0] != cfg.head_dim else cfg.rope_dim))
    heads = _per_layer(gf, "attention.head_count", n)
    kv_heads = _per_layer(gf, "attention.head_count_kv", n) if f"{a}.attention.head_count_kv" in gf.metadata else heads
    ffn = _per_layer(gf, "feed_forward_length", n)
    shapes = tuple((heads[i], kv_heads[i], *(swa_dims if sliding[i] else (cfg.head_dim, cfg.v_head_dim)),
                    rot_swa if sliding[i] else cfg.rope_dim, ffn[i]) for i in range(n))
    for i, (nh, nkv, hd, vd, rot, _) in enumerate(shapes):
        if min(nh, nkv, hd, vd) < 1 or nh % nkv or rot > hd or rot % 2:
            raise ModelLoadError(f"{a} layer {i}: {nh} heads of {hd} over {nkv} KV heads (values {vd}), {rot} rotated "
                                 "dimensions: the heads must be a multiple of the KV heads and the rotated dimensions "
                                 "an even number within the head")
    for kind in (True, False):  # one KV row shape in each pool
        if len({s[1:4] for s, sl in zip(shapes, sliding) if sl == kind}) > 1:
            raise ModelLoadError(f"{a}: the {'sliding-window' if kind else 'full-attention'} layers' KV heads or "
                                 "sizes differ from layer to layer; edgeinfer supports one shape for each kind")
    shared = int(meta(gf, a, "attention.shared_kv_layers", 0) or 0)
    first = n - shared
    source = list(range(n))
    for i in range(first, n):  # llama.cpp: the last sliding layer before them, or the last full one
        source[i] = first - (2 if sliding[i] else 1)
        if not 0 <= source[i] < first or sliding[source[i]] != sliding[i]:
            raise ModelLoadError(f"{a}.attention.shared_kv_layers is {shared}: layer {i} would read layer "
                                 f"{source[i]}'s KV, which is not a layer of its kind with KV of its own")
    base_swa = float(meta(gf, a, "rope.freq_base_swa", cfg.rope_base))
    return replace(cfg, layer_shapes=shapes, sliding_layers=sliding, kv_source=tuple(source) if shared else (),
                   sliding_window=window, rope_base_local=base_swa,
                   rope_dim_local=rot_swa, per_layer_dim=int(meta(gf, a, "embedding_length_per_layer_input", 0) or 0))


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
    if (cfg.ssm_inner // cfg.ssm_heads) % 8:  # the scans run on vectors of eight of a head's channels
        raise ModelLoadError(f"{a}: heads of {cfg.ssm_inner // cfg.ssm_heads} channels (ssm.inner_size {cfg.ssm_inner} / "
                             f"ssm.time_step_rank {cfg.ssm_heads}) are not supported: they must be a multiple of 8")
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
    cfg = replace(cfg, n_expert=n_expert, n_expert_used=used, expert_ffn_dim=int(ffn), shared_ffn_dim=int(shared),
                  ffn_dim=int(shared or cfg.ffn_dim), expert_norm=spec.moe_norm_w,
                  expert_scale=float(meta(gf, a, "expert_weights_scale", 0.0) or 0.0) if spec.moe_scale_w else 0.0)
    if spec.moe_bias:
        gating = int(meta(gf, a, "expert_gating_func", 1) or 1)
        if gating not in (1, 2):  # gguf.ExpertGatingFuncType: SOFTMAX 1, SIGMOID 2
            raise ModelLoadError(f"{a}.expert_gating_func is {gating}: edgeinfer supports 1 (softmax) and 2 (sigmoid)")
        lead = int(meta(gf, a, "leading_dense_block_count", 0) or 0)
        if not 0 <= lead <= cfg.n_layer:
            raise ModelLoadError(f"{a}.leading_dense_block_count is {lead} for {cfg.n_layer} layers")
        cfg = replace(cfg, expert_sigmoid=gating == 2, dense_lead=lead)
    return cfg
