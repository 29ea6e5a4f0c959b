"""The decoder-only transformer every generative architecture here is, read from an ArchSpec.

An architecture module (llama.py, gemma3.py, qwen2.py) declares its SPEC: what its layer has beyond the
plain llama layer (pre-norm, RoPE, GQA attention, a SiLU-gated FFN). This module reads the spec three
times, and nowhere else is an architecture's shape stated:
- `config_from_gguf` (hparams.py): the GGUF metadata into a ModelConfig;
- `load_layer`: which tensors a layer has, under gguf's own tensor names (gguf.TENSOR_NAMES);
- `Model`: `forward_per_op`, the readable reference (one backend call per op, the CUDA backend's path),
  and the compiled step (kernels/cpu/step.py), which takes the spec's switches as flags.
A layer is a sequence of parts (models/parts/: norms, the attention mixer, the dense or expert FFN), each
part's tensors and per-op code in a module of its own. Adding a llama-family architecture is a spec plus
any op it genuinely adds; tests hold the compiled step to forward_per_op.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from gguf.constants import MODEL_TENSOR as TN
from gguf.constants import TENSOR_NAMES

from ..config import ModelConfig
from ..gguf_file import GGUFFile
from . import parts
from .common import ModelLoadError, WeightLoader, check_vocab, meta, rope_inv_freq
from .hparams import config_from_gguf, imrope_pairs, resolve, yarn_mix  # noqa: F401  (resolve: for models/__init__)
from . import per_layer
from .parts import altup, norms

if TYPE_CHECKING:  # the engine's types, only named here: models never build them
    from ..engine.kv_cache import KVCache
    from ..engine.model_runner import Batch

ACTIVATIONS = ("silu", "gelu_tanh")  # the gated FFN's activation of the gate


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
    # the file's expert_gating_func (softmax or sigmoid) and leading_dense_block_count (dense FFN layers
    # first), and a per-expert selection bias exp_probs_b, as llama.cpp reads them for lfm2moe
    moe_bias: bool = False
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
    ffn_norm_part: str = "weight"  # its name's suffix (Falcon-H1's converter writes blk.N.ffn_norm with none)
    imrope: bool = False  # the file's rope.dimension_sections (interleaved multi-section RoPE, qwen35)
    # Qwen3-Next's delta net: beta and alpha in one ssm_ba grouped by key head, value head h reading key head
    # h // (H / Hk); else Qwen3.5's (ssm_beta and ssm_alpha, key head h % Hk)
    delta_next: bool = False
    ssm_norm_optional: bool = False  # a Mamba2 layer's grouped norm only where the file has it (Falcon-H1)
    nope_interval: int = 0  # every nope_interval-th layer without RoPE (SmolLM3: 4, as llama.cpp fixes it)
    attn_temp: bool = False  # the file's attention.temperature_scale on the queries past the original context
    # gpt-oss: a learned attention sink per head (attn_sinks) and a bias on the output projection
    attn_sinks: bool = False
    # gpt-oss's experts: a bias on the router, the k largest logits weighted by a softmax over them alone, a bias
    # on each expert's gate, up and down, and the clamped SwiGLU (llama.cpp's LLM_FFN_SWIGLU_OAI_MOE)
    oai_experts: bool = False
    # Gemma 4: layers of their own shapes and kinds, and shared KV (hparams._layer_shapes_config); each layer's
    # slice of per-layer token inputs added after its FFN (per_layer_input); V RMS-normed (no weights) and
    # V = K where a layer has no attn_v (v_norm); a layer's output times its layer_output_scale where the file
    # has one (layer_scale); the scores not scaled (attn_scale_one)
    layer_shapes: bool = False
    per_layer_input: bool = False
    v_norm: bool = False
    layer_scale: bool = False
    attn_scale_one: bool = False
    gemma4_moe: bool = False  # Gemma 4's experts beside a dense FFN, each normed apart (parts/gemma4_moe.py)
    altup: bool = False  # Gemma 3n's streams of the residual and LAuReL (gemma3n.py, its model of its own)

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")

    @property
    def stack_flags(self) -> dict:
        """The compiled step's switches (kernels.cpu.step.LayerStack)."""
        return {"qk_norm": 2 if self.qk_norm_full else int(self.qk_norm), "post_norms": self.post_norms,
                "gelu": self.activation == "gelu_tanh", "qkv_bias": self.qkv_bias, "pre_norms": self.pre_norms,
                "moe": self.moe, "shared_expert": self.shared_expert, "sinks": self.attn_sinks, "oai": self.oai_experts,
                "attn_gate": self.attn_gate, "feed_forward": self.feed_forward, "moe_scored": self.moe_bias,
                "shared_gate": self.shared_gate, "v_norm": self.v_norm, "g4_moe": self.gemma4_moe}


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
    exp_bias: np.ndarray | None = None  # (n_expert,) the experts' selection bias: moe_bias
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
    sinks: np.ndarray | None = None  # (n_head,) float32: attention sinks (attn_sinks)
    bo: np.ndarray | None = None  # (dim,): the output projection's bias (attn_sinks)
    router_b: np.ndarray | None = None  # (n_expert,): the router's bias (oai_experts)
    exp_gate_b: np.ndarray | None = None  # (n_expert, expert_ffn) float32: each expert's gate bias (oai_experts)
    exp_up_b: np.ndarray | None = None  # (n_expert, expert_ffn)
    exp_down_b: np.ndarray | None = None  # (n_expert, dim)
    ple_gate: object = None  # (per_layer_dim, dim): the gate of the layer's per-layer input (per_layer_input)
    ple_proj: object = None  # (dim, per_layer_dim)
    ple_norm: np.ndarray | None = None  # (dim,)
    out_scale: np.ndarray | None = None  # (1,): the layer's output times it (layer_scale)
    post_ffn_norm_1: np.ndarray | None = None  # (dim,): gemma4_moe: the dense FFN's output norm,
    pre_ffn_norm_2: np.ndarray | None = None  # the experts' input norm,
    post_ffn_norm_2: np.ndarray | None = None  # their output norm,
    router_scale: np.ndarray | None = None  # the router input's per-element scale,
    exp_down_scale: np.ndarray | None = None  # (n_expert,): each expert's output scale (where the file has one)
    laurel_l: object = None  # altup (Gemma 3n): LAuReL's (rank, dim) and (dim, rank) matrices and its norm,
    laurel_r: object = None
    laurel_norm: np.ndarray | None = None
    altup_correct_coef: np.ndarray | None = None  # (n, n) float32: the correction's coefficients,
    altup_correct_scale: np.ndarray | None = None  # (dim,)
    altup_predict_coef: np.ndarray | None = None  # (n * n, n) float32: the prediction's,
    altup_router: np.ndarray | None = None  # (n, dim) float32: the modalities' router and its norm
    altup_router_norm: np.ndarray | None = None


LayerTensor = parts.LayerTensor


def layer_tensors(spec: ArchSpec, cfg: ModelConfig, has=lambda tensor: False, layer: int = 0) -> list[LayerTensor]:
    """The tensors layer `layer` of this architecture has, in load order: each residual block's pre-norm,
    part and post-norm (models/parts/); has(tensor) (a gguf MODEL_TENSOR) says whether the file holds that
    tensor's weight for the layer (for the optional fused q/k/v projection)."""
    out = []
    blocks = (("mixer", parts.mixer(cfg, layer)), ("ffn", parts.feed_forward(spec, cfg, layer)))
    for block, part in blocks[:2 if spec.feed_forward else 1]:
        out += [*norms.pre(spec, cfg, block), *part.tensors(spec, cfg, has), *norms.post(spec, cfg, block)]
    if spec.per_layer_input and cfg.per_layer_dim:  # Gemma 4: gate, projection and norm of its per-layer input
        e = cfg.per_layer_dim
        out += [(("ple_gate",), TN.PER_LAYER_INP_GATE, "weight", (e, cfg.dim), None),
                (("ple_proj",), TN.PER_LAYER_PROJ, "weight", (cfg.dim, e), None),
                (("ple_norm",), TN.PER_LAYER_POST_NORM, "weight", (cfg.dim,), None)]
    if spec.altup:
        out += altup.tensors(cfg)
    if spec.layer_scale and has(TN.LAYER_OUT_SCALE):
        out.append((("out_scale",), TN.LAYER_OUT_SCALE, "weight", (1,), None))
    return out


def tensor_name(tensor: TN, part: str, layer: int) -> str:
    """gguf's name of a layer's tensor: tensor_name(TN.ATTN_Q, "weight", 3) is "blk.3.attn_q.weight"; part
    "": no suffix (Mamba's ssm_a, ssm_d)."""
    name = TENSOR_NAMES[tensor].format(bid=layer)
    return f"{name}.{part}" if part else name


def load_layer(ld: WeightLoader, spec: ArchSpec, cfg: ModelConfig, i: int) -> LayerWeights:
    cfg = cfg.at(i)  # this layer's sizes (Gemma 4's differ by layer)
    got = {}
    has = lambda t, part="weight": ld.has(tensor_name(t, part, i))  # noqa: E731
    for fields, tensor, part, shape, rows in layer_tensors(spec, cfg, has, i):
        name = tensor_name(tensor, part, i)
        if rows == "experts":
            got[fields[0]] = ld.matrix_rows(name, shape, [shape[1]] * shape[0])
        elif rows == "experts_halves":  # fused experts: each one's first half of rows, then its second
            mats = ld.matrix_rows(name, shape, [shape[1] // 2] * (2 * shape[0]))
            got[fields[0]], got[fields[1]] = mats[0::2], mats[1::2]
        elif rows == "float":  # the router (kernels/cpu/moe.py's route), a convolution's taps: transposed
            got[fields[0]] = np.ascontiguousarray(ld.float_matrix(name, *shape).T, dtype=np.float32)
        elif rows == "plain":  # a float 2-D tensor as it is (gpt-oss's per-expert biases)
            got[fields[0]] = np.ascontiguousarray(ld.float_matrix(name, *shape), dtype=np.float32)
        elif rows == "flat":  # a float 2-D tensor read as one vector (Mamba2's A, D and group norm)
            got[fields[0]] = np.ascontiguousarray(ld.float_matrix(name, *shape).reshape(-1), dtype=np.float32)
        elif rows is not None:
            got.update(zip(fields, ld.matrix_rows(name, shape, list(rows))))
        elif len(shape) == 1:
            got[fields[0]] = ld.vector(name, *shape)
        else:
            got[fields[0]] = ld.matrix(name, *shape)
    if spec.v_norm and cfg.kv_of(i) == i and "wk" not in got:  # a layer with KV of its own needs its k
        raise ModelLoadError(f"missing tensor {tensor_name(TN.ATTN_K, 'weight', i)!r}")
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
        if spec.layer_shapes and kb.NAME != "cpu":
            raise ModelLoadError(f"{cfg.arch}'s layers of their own shapes, shared KV and per-layer inputs are not on the "
                                 f"{kb.NAME} backend yet (use the CPU)")
        if cfg.attn_temp and not hasattr(kb, "attn_temperature"):
            raise ModelLoadError(f"{cfg.arch}'s attention temperature (attention.temperature_scale) is not on the "
                                 f"{kb.NAME} backend yet (use the CPU)")
        if cfg.rope_base_local is not None:
            self.inv_freq_local = kb.upload(rope_inv_freq(cfg.rope_dim_local or cfg.rope_dim, cfg.rope_base_local))
        ld = WeightLoader(gf, kb)
        self.tok_embd = ld.matrix("token_embd.weight", cfg.vocab_size, cfg.dim)
        self.layers = [load_layer(ld, spec, cfg, i) for i in range(cfg.n_layer)]
        self.ple = None
        if spec.per_layer_input and cfg.per_layer_dim:  # Gemma 4's per-layer token inputs (per_layer.py)
            self.ple = per_layer.load(ld, cfg)
        self._extra(ld, cfg)
        self.output_norm = ld.vector(f"{spec.output_norm}.weight", cfg.dim)
        self.output = ld.matrix("output.weight", cfg.vocab_size, cfg.dim) if ld.has("output.weight") else self.tok_embd
        factors = self._rope_factors(gf, ld, n_ctx)
        ld.finish()
        inv_freq = rope_inv_freq(cfg.rope_dim, cfg.rope_base, cfg.rope_freq_scale, factors)
        if cfg.rope_yarn:  # YaRN: each pair's angle between the interpolated and the original one
            inv_freq = rope_inv_freq(cfg.rope_dim, cfg.rope_base, 1.0, factors) * yarn_mix(cfg)
        if cfg.rope_sections:  # IMRoPE: the fourth section's pairs keep angle 0 for text
            inv_freq = np.where(imrope_pairs(cfg.rope_sections, inv_freq.shape[0]), inv_freq, 0.0)
        self.inv_freq = kb.upload(inv_freq)
        self.inv_freq_none = kb.upload(np.zeros_like(inv_freq))  # a layer without positions: angle 0, x unchanged
        # every layer in one compiled call where the backend has one; forward_per_op is the reference
        self.stack = self._stack(kb, spec)
        self.lora = None  # LoRA adapters beside the matrices (models/lora.py's attach)

    def _stack(self, kb, spec: ArchSpec):
        """The layers in one compiled call (the backend's), or None: per op."""
        return kb.layer_stack(self.cfg, self.layers, [self.layer_inv_freq(i) for i in range(self.cfg.n_layer)],
                              **spec.stack_flags)

    def _extra(self, ld: WeightLoader, cfg: ModelConfig) -> None:
        """An architecture's model-wide tensors beyond these (gemma3n.Model's AltUp projections)."""

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
        cfg = self.cfg
        if cfg.nope_interval and (layer + 1) % cfg.nope_interval == 0:
            return self.inv_freq_none
        return self.inv_freq_local if cfg.is_sliding(layer) and cfg.rope_base_local is not None else self.inv_freq

    def forward(self, batch: Batch, cache: KVCache, hidden: bool = False) -> np.ndarray:
        """Logits (L, vocab), on the host, for the tokens batch.logits_idx selects; hidden: their final
        hidden states after the output norm (L, dim) instead (what llama.cpp's embeddings are)."""
        # per op: a first run until the step is compiled, a batch with rows attending non-causally (images), and
        # rows with LoRA adapters at work on matrices the step does not adapt (LoraSet.step None)
        lora, scales = self.lora, None
        if lora is not None:  # each row at its sequence's scales, or the model's own (read once: /lora-adapters)
            scales = getattr(batch, "lora", None)
            if scales is None:
                scales = np.tile(lora.scales, (len(batch.token_ids), 1))
        adapting = scales is not None and bool(scales.any())
        if self.stack is None or not self.kb.step_ready() or batch.spans or (adapting and lora.step is None):
            return self.forward_per_op(batch, cache, hidden)
        if adapting:
            lora.set_rows(scales)
        x = self.embed(batch.token_ids, batch, adapting)
        ple = per_layer.inputs(self.kb, self.cfg, self.ple, batch.token_ids, x) if self.ple is not None else None
        rows = self.stack.run(x, batch, cache, ple, lora.step if adapting else None, scales if adapting else None)
        if lora is not None:  # the output's rows at their scales
            lora.set_rows(scales[batch.logits_idx])
        return self.normed(rows) if hidden else self.logits(rows)

    def embed(self, token_ids, batch: Batch | None = None, lora: bool = False):
        x = self.kb.embed(self.tok_embd, token_ids)
        if lora and self.lora.embd:  # the embeddings' adapters (per op), before the scale (as llama.cpp)
            self.lora.add_embeddings(self.kb, x, token_ids)
        if self.cfg.embed_scale != 1.0:  # Gemma's sqrt(dim), Granite's embedding_scale
            self.kb.scale_(x, self.cfg.embed_scale)
        for row, rows in getattr(batch, "embeds", ()):  # an image's rows, unscaled (as llama.cpp)
            x[row:row + len(rows)] = rows
        return x

    def forward_per_op(self, batch: Batch, cache: KVCache, hidden: bool = False) -> np.ndarray:
        """The reference forward: one backend call per op (the CUDA backend's path)."""
        kb, cfg, spec = self.kb, self.cfg, self.spec
        host, batch = batch, kb.prepare_batch(batch)
        layers, lora = self.layers, self.lora
        rows_lora = getattr(host, "lora", None)
        if lora is not None:  # each row at its sequence's scales, or the model's own
            lora.set_rows(rows_lora)
            layers = lora.layers
        x = self.embed(batch.token_ids, host, lora is not None)
        ple = per_layer.inputs(kb, cfg, self.ple, batch.token_ids, x) if self.ple is not None else None
        h = kb.empty(x.shape)
        for i, lw in enumerate(layers):  # two residual blocks a layer: the mixer's, the feed-forward's
            at = parts.Where(i, batch, cache, self.layer_inv_freq(i), x)
            c = cfg.at(i)
            parts.residual(kb, c, spec, parts.mixer(cfg, i), lw, x, h, lw.attn_norm, lw.post_attn_norm, at)
            if spec.feed_forward:
                parts.residual(kb, c, spec, parts.feed_forward(spec, cfg, i), lw, x, h, lw.ffn_norm, lw.post_ffn_norm,
                               at)
            if ple is not None:
                per_layer.add(kb, cfg, lw, x, ple[i])
            if lw.out_scale is not None:  # Gemma 4's layer_output_scale
                kb.scale_(x, np.float32(kb.to_host(lw.out_scale)[0]))
        rows = kb.take_rows(x, batch.logits_idx)
        if lora is not None and rows_lora is not None:
            lora.set_rows(rows_lora[host.logits_idx])
        return self.normed(rows) if hidden else self.logits(rows)

    def normed(self, x) -> np.ndarray:
        """Hidden states after the output norm, on the host."""
        h = self.kb.empty(x.shape)
        self.kb.rmsnorm(x, self.output_norm, np.float32(self.cfg.norm_eps), h)
        return self.kb.to_host(h)

    def logits(self, x) -> np.ndarray:
        h = self.kb.empty(x.shape)
        self.kb.rmsnorm(x, self.output_norm, np.float32(self.cfg.norm_eps), h)  # float32 eps: the step's own
        return self.project(h)

    def project(self, h, output=None) -> np.ndarray:
        """Logits, on the host, of hidden states after the output norm (h, as `normed` gives them) through the
        output matrix, or through `output`: some of its rows (a draft's head, speculative.py)."""
        kb, cfg = self.kb, self.cfg
        if output is None:
            output = self.output if self.lora is None or self.lora.output is None else self.lora.output
        out = kb.matmul(output, h)
        if cfg.logit_scale:  # Granite: llama.cpp scales by the float32 1 / logit_scale
            kb.scale_(out, np.float32(1.0) / np.float32(cfg.logit_scale))
        if cfg.final_softcap > 0:
            kb.softcap(out, np.float32(cfg.final_softcap))
        return kb.to_host(out)


__all__ = ["ArchSpec", "LayerWeights", "Model", "config_from_gguf", "layer_tensors", "load_layer"]
