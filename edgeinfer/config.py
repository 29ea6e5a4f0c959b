"""Frozen configuration objects passed down through the runtime."""

from __future__ import annotations

from dataclasses import dataclass, replace

from .cpus import default_threads  # noqa: F401  (the kernels' default thread count, read here by the runtime)


@dataclass(frozen=True)
class ModelConfig:
    """Architecture hyper-parameters, built from GGUF metadata by the architecture module."""

    arch: str
    n_layer: int
    dim: int
    n_head: int
    n_kv_head: int
    head_dim: int
    v_head_dim: int
    ffn_dim: int
    vocab_size: int
    context_length: int
    norm_eps: float
    rope_base: float
    rope_dim: int  # dimensions rotated per head (n_rot)
    rope_neox: bool  # rotate (i, i + n/2) pairs rather than (2i, 2i + 1)
    rope_freq_scale: float = 1.0  # linear rope scaling: positions are multiplied by this
    rope_base_local: float | None = None  # sliding-window layers' rope base (gemma3)
    sliding_window: int = 0  # 0: none
    swa_pattern: int = 0  # every swa_pattern-th layer is global; 0: all layers global
    attn_scale: float | None = None  # default 1/sqrt(head_dim)
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    embed_scale: float = 1.0
    rope_mscale: float = 1.0  # rotated q/k values times this (LongRoPE's attn_factor); 1: none
    rope: bool = True  # False: the attention layers have no positions at all (NoPE: Granite 4 H, Nemotron-H)
    nope_interval: int = 0  # every nope_interval-th layer has no positions (SmolLM3: 4); 0: none
    # YaRN RoPE scaling: (original context, beta_fast, beta_slow): each pair's angle between the interpolated
    # (rope_freq_scale) and the original one by a ramp over the pairs, cos and sin times rope_mscale; () none
    rope_yarn: tuple = ()
    # Llama 4 / Mistral 3 attention temperature: (scale, floor) each query times log(floor(pos / floor) + 1)
    # * scale + 1 (1 before the original context); () none
    attn_temp: tuple = ()
    # interleaved multi-section RoPE (Qwen3.5's IMRoPE): text tokens rotate every pair by their position but
    # the pairs of the fourth section, which stay unrotated; () none
    rope_sections: tuple = ()
    # Granite's multipliers (0: none): each block's output times residual_scale before its residual add,
    # the logits divided by logit_scale
    residual_scale: float = 0.0
    logit_scale: float = 0.0
    # mixture-of-experts (0 experts: a dense FFN): n_expert_used of n_expert experts per token, each an
    # FFN of expert_ffn_dim; shared_ffn_dim > 0: a shared expert too (qwen2moe); expert_norm: the chosen
    # experts' weights renormalised to sum 1; expert_scale (not 0 or 1): the weights times it
    n_expert: int = 0
    n_expert_used: int = 0
    expert_ffn_dim: int = 0
    shared_ffn_dim: int = 0
    expert_norm: bool = False
    expert_scale: float = 0.0
    expert_sigmoid: bool = False  # each expert's probability a sigmoid, not a softmax over them (lfm2moe)
    dense_lead: int = 0  # the first dense_lead layers have a dense FFN of ffn_dim instead of experts (lfm2moe)
    # layers by the memory they keep: () every layer attention (paged KV); else one mixer name a layer,
    # "attention", "shortconv" (LFM2's gated short convolution: a recurrent state of its last
    # conv_l_cache - 1 inputs per sequence, no KV), "mamba2" (a selective state-space layer: a state of
    # its convolution's last ssm_conv - 1 inputs and an (ssm_heads, head, ssm_state) matrix per sequence)
    # "deltanet" (a gated delta net, Qwen3.5's linear attention: a state of its convolution's last ssm_conv - 1
    # inputs and an (ssm_heads, ssm_state, ssm_state) matrix per sequence) or "mlp" (a layer that is a
    # feed-forward block alone, Nemotron-H's: no memory), or "attn_mamba2" (attention and a Mamba2 mixer side by
    # side, Falcon-H1's: both KV and a state)
    mixers: tuple = ()
    conv_l_cache: int = 0
    ssm_conv: int = 0  # Mamba2: the convolution's taps (d_conv),
    ssm_inner: int = 0  # d_inner (ssm_heads heads of ssm_inner / ssm_heads),
    ssm_state: int = 0  # d_state,
    ssm_heads: int = 0  # heads (time_step_rank),
    ssm_groups: int = 0  # groups of B and C (n_group)
    # layers of their own shapes (Gemma 4): each layer's (n_head, n_kv_head, head_dim, v_head_dim, rope_dim,
    # ffn_dim), read through at(layer); () every layer the fields above
    layer_shapes: tuple = ()
    sliding_layers: tuple = ()  # which layers are sliding-window ones, one bool a layer (else swa_pattern)
    # each layer's KV: its own index, or an earlier layer's whose KV it reads and holds none of its own
    # (Gemma 4's last attention.shared_kv_layers layers); () every layer its own
    kv_source: tuple = ()
    per_layer_dim: int = 0  # Gemma 4's per-layer token inputs: each layer's slice of them (0: none)
    rope_dim_local: int = 0  # the sliding-window layers' rotated dimensions (0: rope_dim)
    altup: int = 0  # Gemma 3n's streams of the residual (AltUp; 0: none), the active one, LAuReL's rank
    altup_active: int = 0
    laurel_rank: int = 0

    def is_sliding(self, layer: int) -> bool:
        if self.sliding_layers:
            return self.sliding_window > 0 and bool(self.sliding_layers[layer])
        return self.sliding_window > 0 and self.swa_pattern > 0 and (layer + 1) % self.swa_pattern != 0

    def at(self, layer: int) -> "ModelConfig":
        """The config as layer `layer` sees it: its head counts and sizes and FFN width where the model's
        layers differ in them (layer_shapes), else this one."""
        if not self.layer_shapes:
            return self
        n_head, n_kv_head, head_dim, v_head_dim, rope_dim, ffn_dim = self.layer_shapes[layer]
        return replace(self, n_head=n_head, n_kv_head=n_kv_head, head_dim=head_dim, v_head_dim=v_head_dim,
                       rope_dim=rope_dim, ffn_dim=ffn_dim, layer_shapes=())

    def kv_of(self, layer: int) -> int:
        """The layer whose KV layer `layer` reads (itself, or an earlier one's it shares)."""
        return self.kv_source[layer] if self.kv_source else layer

    def pool_shape(self, window: bool) -> tuple:
        """(n_kv_head, head_dim, v_head_dim) of the KV rows of the full-context pool's layers, or of the window
        pool's (the sliding-window layers, which may have rows of their own: Gemma 4)."""
        layers = [i for i in self.kv_layers if self.is_sliding(i) == window] or [0]
        c = self.at(layers[0])
        return c.n_kv_head, c.head_dim, c.v_head_dim

    def mixer(self, layer: int) -> str:
        return self.mixers[layer] if self.mixers else "attention"

    @property
    def kv_layers(self) -> tuple:
        """The layers that keep paged KV (the attention layers), in order."""
        return tuple(i for i in range(self.n_layer) if self.mixer(i) in ("attention", "attn_mamba2") and self.kv_of(i) == i)

    @property
    def window_layers(self) -> tuple:
        """The attention layers that see only the last sliding_window tokens, whose KV a window pool keeps
        (engine/kv_cache.py); none in a model with recurrent layers (their KV stays in the full pool)."""
        return () if self.recurrent else tuple(i for i in self.kv_layers if self.is_sliding(i))

    @property
    def conv_layers(self) -> tuple:
        """The layers that keep a convolution state per sequence, in order."""
        return tuple(i for i in range(self.n_layer) if self.mixer(i) == "shortconv")

    @property
    def ssm_layers(self) -> tuple:
        """The layers with a convolution and a state matrix per sequence (Mamba2, the gated delta net), in
        order."""
        return tuple(i for i in range(self.n_layer) if self.mixer(i) in ("mamba2", "deltanet", "attn_mamba2"))

    @property
    def ssm_conv_dim(self) -> int:
        """Channels of a Mamba2 layer's convolution: x, B and C (a delta net's: q, k and v)."""
        return self.ssm_inner + 2 * self.ssm_groups * self.ssm_state

    @property
    def recurrent(self) -> bool:
        """Whether some layer keeps a recurrent state per sequence (a hybrid or state-space model)."""
        return bool(self.conv_layers or self.ssm_layers)

    @property
    def state_bytes_per_seq(self) -> int:
        """A sequence's recurrent state, all layers, float32: convolution states and SSM matrices."""
        conv = len(self.conv_layers) * self.dim * max(self.conv_l_cache - 1, 0)
        ssm = len(self.ssm_layers) * ((self.ssm_conv - 1) * self.ssm_conv_dim + self.ssm_inner * self.ssm_state)
        return 4 * (conv + ssm)


KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")
DEFAULT_MAX_CONTEXT = 4096  # tokens per sequence when the caller does not say: an edge box's KV budget


def kv_type_name(kv: str, default: str = "f16") -> str:
    """A KV type as given, "T" (K and V both T) or "K/V" (either side empty: `default`), as the one name of
    K's and V's types where they agree, else "K/V" (kernels/kv_format.kv_name). ValueError on an unknown type."""
    k, slash, v = kv.partition("/")
    k = k or default
    v = (v or default) if slash else k
    for t in (k, v):
        if t not in KV_TYPES:
            raise ValueError(f"KV type {t!r} is not one of {', '.join(KV_TYPES)} (K's and V's may differ: "
                             "K/V, as q8_0/f16)")
    return k if k == v else f"{k}/{v}"


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs: threads, KV cache size, batching limits, backend."""

    threads: int = 0  # 0: all available cores
    block_size: int = 16
    num_kv_blocks: int = 0  # 0: one full context's worth, shared by the running sequences (see memory.py)
    kv_cache_mb: float = 0.0  # an upper bound on the KV pool when num_kv_blocks is 0 (0: none, one full context)
    # KV storage: "f32"; "f16" (half of f32; the CPU default, as llama.cpp's); "q8_0" (int8 blocks of 32
    # with a float16 scale: 53% of f16); or "K/V", K and V each its own (as llama.cpp's -ctk, -ctv; "q8_0/f16").
    # "" picks the backend's default (f16 on the CPU, f32 on CUDA). Kept as one name where K's and V's agree.
    kv_dtype: str = ""
    max_seqs: int = 0  # 0: sized for the cores (4 per core, at least 8)
    max_num_batched_tokens: int = 512
    # 0: sized by LLM: the model's trained context, cut to what memory allows (memory.context_for_memory); an
    # engine made without LLM: the model's capped at DEFAULT_MAX_CONTEXT
    max_context: int = 0
    backend: str = "cpu"
    # 0: none. Else the MB this model may use in all (runtime + weights + KV + buffers): the KV pool and
    # the number of sequences are sized to fit, or loading fails naming the smallest budget that fits.
    memory_budget_mb: float = 0.0
    # a folder: computed prefix blocks are kept there too (at most prompt_cache_mb), and found after a restart
    prompt_cache: str = ""
    prompt_cache_mb: float = 1024.0

    def __post_init__(self):
        for name in ("threads", "num_kv_blocks", "max_context", "max_seqs"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("block_size", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.kv_cache_mb < 0:
            raise ValueError(f"kv_cache_mb must be >= 0, got {self.kv_cache_mb}")
        if self.backend not in ("cpu", "cuda"):
            raise ValueError(f"backend must be 'cpu' or 'cuda', got {self.backend!r}")
        default = "f32" if self.backend == "cuda" else "f16"
        object.__setattr__(self, "kv_dtype", kv_type_name(self.kv_dtype or default, default))
        if self.backend == "cuda" and self.kv_dtype != "f32":
            raise ValueError(f"the CUDA backend has no {self.kv_dtype} KV cache yet: use kv type 'f32'")
        if self.memory_budget_mb < 0:
            raise ValueError(f"memory_budget_mb must be >= 0, got {self.memory_budget_mb}")
        if self.prompt_cache_mb <= 0:
            raise ValueError(f"prompt_cache_mb must be > 0, got {self.prompt_cache_mb}")

    @property
    def seqs_limit(self) -> int:
        """max_seqs, or a figure sized for the machine: 4 running sequences per core, at least 8.
        Decode is bound by reading the weights, so more sequences per step cost little each."""
        return self.max_seqs or max(8, 4 * default_threads())
