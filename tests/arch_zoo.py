"""A zoo of small random GGUF models, one per architecture edgeinfer should run, written with gguf.GGUFWriter.

Every writer is deterministic (fixed numpy seed, no timestamps): the same bytes on every run, so the
sha256 recorded in tests/golden/arch_zoo.json (made by benchmarks/make_arch_golden.py with llama.cpp)
identifies the model the reference logits belong to.

    from arch_zoo import ZOO, write
    write("qwen3", tmp_path / "qwen3.gguf")

Shapes keep every matrix's row length (its fan-in) a multiple of 256, so any of them can be a K-quant.
Quantization types follow what real files use (Q4_K_M-style Q4_K/Q6_K mixes, Q5_K, Q8_0, F16), spread
over the zoo. Notes on what llama.cpp (the build bundled with llama-cpp-python 0.3.36) does with each
architecture are next to its writer; they were read from llama.cpp's src/models/<arch>.cpp and checked
against the library's behaviour (benchmarks/make_arch_golden.py).
"""

from __future__ import annotations

import math
import os

import gguf
import numpy as np
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as T

from edgeinfer.tokenizer import bytes_to_unicode

try:
    from tiny_models import add_spm_vocab, finish as _finish, quantize_rows as _quantize
    from tiny_models import add_tensor as _add
except ImportError:  # imported as tests.arch_zoo
    from .tiny_models import add_spm_vocab, finish as _finish, quantize_rows as _quantize
    from .tiny_models import add_tensor as _add

GPT2_MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s"]  # write_tiny_llama's
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Qwen3's template, cut down: ChatML, reasoning of assistant turns after the last user turn rendered in a
# <think> block (from reasoning_content or an inline <think>...</think>), earlier ones dropped, and with
# enable_thinking false an empty think block opening the generation prompt.
QWEN3_TEMPLATE = (
    "{%- set ns = namespace(last_query=-1) %}"
    "{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set ns.last_query = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{%- set content = message['content'] %}{%- set reasoning = '' %}"
    "{%- if message.get('reasoning_content') %}{%- set reasoning = message['reasoning_content'] %}"
    "{%- elif '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\n') %}{%- endif %}"
    "{{- '<|im_start|>assistant\n' }}"
    "{%- if loop.index0 > ns.last_query %}{{- '<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' }}{%- endif %}"
    "{{- content + '<|im_end|>\n' }}"
    "{%- else %}{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}"
    "{%- endif %}"
)
LLAMA3_TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"
)
PHI3_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
# Granite 4's template, cut down: roles in <|start_of_role|>ROLE<|end_of_role|> ... <|end_of_text|>
GRANITE_TEMPLATE = (
    "{%- for message in messages %}{{ '<|start_of_role|>' + message['role'] + '<|end_of_role|>' + message['content'] "
    "+ '<|end_of_text|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{ '<|start_of_role|>assistant"
    "<|end_of_role|>' }}{%- endif %}"
)
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% set role = 'model' if message['role'] == 'assistant' "
    "else message['role'] %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


# ---------------------------------------------------------------------------------------------- helpers

def _more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits (llama-quant.cpp): the layers Q4_K_M gives Q6_K attn_v / ffn_down."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _gpt2_vocab(w: gguf.GGUFWriter, specials: list[str], *, pre: str = "default", bos: int | None = None,
                eos: int = 0, add_bos: bool = False, n_extra: int = 0, template: str | None = CHATML) -> int:
    """write_tiny_llama's GPT-2 byte-level BPE vocabulary (specials first, 256 bytes, a few merges), plus
    n_extra plain tokens for a realistic vocabulary size. Returns the vocabulary size."""
    b2u = bytes_to_unicode()
    tokens = list(specials) + [b2u[b] for b in range(256)] + [m.replace(" ", "") for m in GPT2_MERGES]
    tokens += [f"Ġw{i:05d}" for i in range(n_extra)]
    types = [3] * len(specials) + [1] * (len(tokens) - len(specials))
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(GPT2_MERGES)
    if bos is not None:
        w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(add_bos)
    if template is not None:
        w.add_chat_template(template)
    return len(tokens)


def _spm_vocab(w: gguf.GGUFWriter) -> int:
    """tiny_models.spm_vocab (write_tiny_gemma3's SentencePiece vocabulary) with Gemma's chat template."""
    n = add_spm_vocab(w, with_size=True)
    w.add_chat_template(GEMMA_TEMPLATE)
    return n


def _hparams(w: gguf.GGUFWriter, name: str, *, n_layer: int, n_ctx: int, dim: int, ffn: int, n_head: int, n_kv,
             head_dim: int | None = None, rope_dim: int | None = None, base: float = 10000.0, eps: float = 1e-6) -> None:
    w.add_block_count(n_layer)
    w.add_context_length(n_ctx)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    if head_dim is not None:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_rope_dimension_count(rope_dim if rope_dim is not None else (head_dim or dim // n_head))
    w.add_rope_freq_base(base)
    w.add_layer_norm_rms_eps(eps)


class _Init:
    """Random weights of sane size: ~N(0, 1)/sqrt(fan_in) times a multiplier; norms near 1. The multipliers
    were tuned so the models are not chaotic: two correct engines' rounding (8-bit activations in the
    quantized dot products, an f16 KV cache, summation order) moves the top-20 log-probabilities by well
    under the real-model golden tolerance (0.6), and our own f32 and f16 KV caches differ about as much
    from each other as from llama.cpp."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def mat(self, rows: int, cols: int, mult: float = 1.0) -> np.ndarray:
        return self.rng.standard_normal((rows, cols)) * (mult / np.sqrt(cols))

    def exps(self, n: int, rows: int, cols: int, mult: float = 1.0) -> np.ndarray:
        return self.rng.standard_normal((n, rows, cols)) * (mult / np.sqrt(cols))

    def norm(self, n: int) -> np.ndarray:
        return 1 + 0.1 * self.rng.standard_normal(n)

    def vec(self, n: int, s: float = 1.0) -> np.ndarray:
        return s * self.rng.standard_normal(n)

    def embd(self, vocab: int, dim: int, s: float = 0.5) -> np.ndarray:
        return self.rng.standard_normal((vocab, dim)) * s


def _attention(w, r: "_Init", p: str, dim: int, n_head: int, n_kv: int, hd: int, qtype: T, *, qk: float = 1.0,
               vtype: T | None = None, otype: T | None = None, o_mult: float = 1.0, between=()) -> None:
    """A layer's attention tensors, in the order the writers add them (the random draws follow it): q and k
    (times qk), v, then `between` ((name, make) pairs: q/k norms or biases, made in that order, F32), then
    the output projection (times o_mult)."""
    _add(w, p + "attn_q.weight", r.mat(n_head * hd, dim, qk), qtype)
    _add(w, p + "attn_k.weight", r.mat(n_kv * hd, dim, qk), qtype)
    _add(w, p + "attn_v.weight", r.mat(n_kv * hd, dim), vtype or qtype)
    for name, make in between:
        _add(w, p + name, make())
    _add(w, p + "attn_output.weight", r.mat(dim, n_head * hd, o_mult), otype or qtype)


def _swiglu(w, r: "_Init", p: str, dim: int, ffn: int, down: T) -> None:
    """A layer's pre-FFN norm and SiLU-gated FFN (Q4_K gate and up, the down projection x1.5 as `down`)."""
    _add(w, p + "ffn_norm.weight", r.norm(dim))
    _add(w, p + "ffn_gate.weight", r.mat(ffn, dim), T.Q4_K)
    _add(w, p + "ffn_up.weight", r.mat(ffn, dim), T.Q4_K)
    _add(w, p + "ffn_down.weight", r.mat(dim, ffn, 1.5), down)


def _qk_norm_attention(w, r: "_Init", p: str, dim: int, n_head: int, n_kv: int, hd: int, vtype: T) -> None:
    """Qwen3-style attention (qwen3, lfm2): Q4_K q/k/o (o x1.5), v as `vtype`, per-head q/k norm weights
    at 0.65 so attention is not so sharp that rounding decides it."""
    _attention(w, r, p, dim, n_head, n_kv, hd, T.Q4_K, vtype=vtype, o_mult=1.5,
               between=[("attn_q_norm.weight", lambda: 0.65 * r.norm(hd)),
                        ("attn_k_norm.weight", lambda: 0.65 * r.norm(hd))])


def _q4km(kind: str, i: int, n: int) -> T:
    """Q4_K_M-like: Q4_K everywhere, Q6_K for attn_v / ffn_down on llama.cpp's use_more_bits layers."""
    return T.Q6_K if kind in ("attn_v", "ffn_down", "ffn_down_exps") and _more_bits(i, n) else T.Q4_K


# ---------------------------------------------------------------------------------------------- writers

def write_qwen3(path) -> None:
    """qwen3: 3 layers, dim 256, 4 heads / 2 kv heads, head_dim 64 (attention.key_length), ffn 512, per-head
    q/k RMS norms (size head_dim) applied before RoPE, no biases, NeoX RoPE (base 1e6), tied embedding.
    Q4_K_M-like (Q6_K token_embd, as llama-quantize gives a tied one). A small embedding (0.12) and layer
    outputs of x1.5 so the tied embedding of the current token does not dominate the last hidden state
    (greedy would repeat it); q/k at x1 with norm weights 0.65, so attention is not so sharp that rounding
    (8-bit activations, f16 KV) decides it. Vocabulary has <think> and </think> as special tokens; the chat template renders Qwen3-style think blocks."""
    n_layer, dim, n_head, n_kv, hd, ffn = 3, 256, 4, 2, 64, 512
    r = _Init(1)
    w = gguf.GGUFWriter(str(path), "qwen3")
    _hparams(w, "qwen3", n_layer=n_layer, n_ctx=512, dim=dim, ffn=ffn, n_head=n_head, n_kv=n_kv, head_dim=hd,
             base=1e6)
    vocab = _gpt2_vocab(w, ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"], pre="qwen2",
                        eos=2, template=QWEN3_TEMPLATE)
    w.add_pad_token_id(0)
    _add(w, "token_embd.weight", r.embd(vocab, dim, 0.12), T.Q6_K)
    for i in range(n_layer):
        p = f"blk.{i}."
        _add(w, p + "attn_norm.weight", r.norm(dim))
        # q.k/sqrt(head_dim) after the norms ~ N(0, 3.4^2)
        _qk_norm_attention(w, r, p, dim, n_head, n_kv, hd, _q4km("attn_v", i, n_layer))
        _swiglu(w, r, p, dim, ffn, _q4km("ffn_down", i, n_layer))
    _add(w, "output_norm.weight", 1.6 * r.norm(dim))
    _finish(w)


LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]


def llama3_rope_factors(head_dim: int, base: float, factor: float = 8.0, low_freq_factor: float = 1.0,
                        high_freq_factor: float = 4.0, old_context_len: int = 8192) -> np.ndarray:
    """rope_freqs.weight as convert_hf_to_gguf.py (LlamaModel.generate_extra_tensors, rope_type llama3)
    computes it: one factor per rotated pair; llama.cpp divides each pair's frequency by it (ggml_rope_ext's
    freq_factors: theta_i = pos * base^(-2i/n_rot) / factor_i)."""
    # base ** (2i / head_dim) by the C library's pow, rounded to float32: numpy's float32 power gives other
    # roundings where it has SIMD code of its own (AVX-512 hosts: 7 of these 32), which changed the file
    exps = np.arange(0, head_dim, 2, dtype=np.float32) / head_dim
    freqs = 1.0 / np.array([base ** float(e) for e in exps], np.float32)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            out.append(1.0)
        elif wavelen > low_freq_wavelen:
            out.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_llama3(path) -> None:
    """llama (Llama 3.x style): 3 layers, dim 256, 4 heads / 1 kv head (head_dim 64), ffn 512, normal
    (GPT-J, interleaved-pair) RoPE, base 500000, with Llama 3 RoPE scaling as a rope_freqs.weight F32 tensor
    of head_dim/2 = 32 factors (factor 8, low 1, high 4, original context 64 instead of 8192 so that the
    factors span 1 .. 8 for this head_dim/base: 3 pairs at 1, 3 smoothed, 26 at 8). llama.cpp applies
    rope_freqs whenever the tensor is present (get_rope_factors returns it before looking at n_ctx);
    there is no rope.scaling key. Untied output. tokenizer.ggml.pre llama-bpe, BOS added.
    Types: Q4_K_M-like, token_embd Q4_K, output Q6_K."""
    n_layer, dim, n_head, n_kv, ffn, base = 3, 256, 4, 1, 512, 500000.0
    hd = dim // n_head
    r = _Init(2)
    w = gguf.GGUFWriter(str(path), "llama")
    _hparams(w, "llama3", n_layer=n_layer, n_ctx=512, dim=dim, ffn=ffn, n_head=n_head, n_kv=n_kv, base=base,
             eps=1e-5)
    vocab = _gpt2_vocab(w, LLAMA3_SPECIALS, pre="llama-bpe", bos=0, eos=2, add_bos=True, template=LLAMA3_TEMPLATE)
    _add(w, "rope_freqs.weight", llama3_rope_factors(hd, base, old_context_len=64))
    _add(w, "token_embd.weight", r.embd(vocab, dim), T.Q4_K)
    for i in range(n_layer):
        p = f"blk.{i}."
        _add(w, p + "attn_norm.weight", r.norm(dim))
        _attention(w, r, p, dim, n_head, n_kv, hd, T.Q4_K, qk=1.2, vtype=_q4km("attn_v", i, n_layer))
        _add(w, p + "ffn_norm.weight", r.norm(dim))
        _add(w, p + "ffn_gate.weight", r.mat(ffn, dim), T.Q4_K)
        _add(w, p + "ffn_up.weight", r.mat(ffn, dim), T.Q4_K)
        _add(w, p + "ffn_down.weight", r.mat(dim, ffn), _q4km("ffn_down", i, n_layer))
    _add(w, "output_norm.weight", r.norm(dim))
    _add(w, "output.weight", r.mat(vocab, dim, 3), T.Q6_K)
    _finish(w)


def write_llama_swa(path) -> None:
    """llama with llama.attention.sliding_window = 8 (Mistral-7B-v0.1 style; the window is small so it would
    matter on the golden prompts of 24 and 40 tokens). llama.cpp IGNORES the key for arch llama:
    llama_model_llama::load_arch_hparams never reads LLM_KV_ATTENTION_SLIDING_WINDOW, swa_type stays NONE
    and the graph uses the plain (non-SWA) KV cache, so every layer attends to the whole causal prefix.
    make_arch_golden.py checks this (the same model without the key gives the same logits).
    2 layers, dim 256, 8 heads / 2 kv heads (head_dim 32), ffn 512, all Q8_0, untied output."""
    n_layer, dim, n_head, n_kv, ffn = 2, 256, 8, 2, 512
    hd = dim // n_head
    r = _Init(3)
    w = gguf.GGUFWriter(str(path), "llama")
    _hparams(w, "llama_swa", n_layer=n_layer, n_ctx=512, dim=dim, ffn=ffn, n_head=n_head, n_kv=n_kv, eps=1e-5)
    w.add_sliding_window(8)
    vocab = _gpt2_vocab(w, ["<unk>", "<s>", "</s>"], bos=1, eos=2, add_bos=True, template=None)
    _add(w, "token_embd.weight", r.embd(vocab, dim), T.Q8_0)
    for i in range(n_layer):
        p = f"blk.{i}."
        _add(w, p + "attn_norm.weight", r.norm(dim))
        _attention(w, r, p, dim, n_head, n_kv, hd, T.Q8_0, qk=1.2)
        _add(w, p + "ffn_norm.weight", r.norm(dim))
        _add(w, p + "ffn_gate.weight", r.mat(ffn, dim), T.Q8_0)
        _add(w, p + "ffn_up.weight", r.mat(ffn, dim), T.Q8_0)
        _add(w, p + "ffn_down.weight", r.mat(dim, ffn), T.Q8_0)
    _add(w, "output_norm.weight", r.norm(dim))
    _add(w, "output.weight", r.mat(vocab, dim, 3), T.Q8_0)
    _finish(w)


def write_smollm3(path) -> None:
    """smollm3 (SmolLM3): the llama layer with every fourth layer's q and k not rotated (llama.cpp fixes
    n_no_rope_layer_step at 4; no key). 4 layers (the last without RoPE), dim 256, 4 heads / 2 kv heads
    (head_dim 64), ffn 512, normal RoPE base 5e6 (SmolLM3's), tied output (no output.weight), Q4_K_M-like
    types with a Q6_K token_embd (the output's type when tied)."""
    n_layer, dim, n_head, n_kv, ffn = 4, 256, 4, 2, 512
    hd = dim // n_head
    r = _Init(33)
    w = gguf.GGUFWriter(str(path), "smollm3")
    _hparams(w, "smollm3", n_layer=n_layer, n_ctx=512, dim=dim, ffn=ffn, n_head=n_head, n_kv=n_kv, base=5e6)
    vocab = _gpt2_vocab(w, ["<|im_start|>", "<|im_end|>", "<|end_of_text|>"], bos=None, eos=1, add_bos=False,
                        template=None)
    _add(w, "token_embd.weight", r.embd(vocab, dim, 0.2), T.Q6_K)  # (the output too: logits of std ~3)
    for i in range(n_layer):
        p = f"blk.{i}."
        _add(w, p + "attn_norm.weight", r.norm(dim))
        _attention(w, r, p, dim, n_head, n_kv, hd, T.Q4_K, vtype=_q4km("attn_v", i, n_layer))
        _swiglu(w, r, p, dim, ffn, _q4km("ffn_down", i, n_layer))
    _add(w, "output_norm.weight", r.norm(dim))
    _finish(w)


PHI3_ORIG_CTX = 256  # llama.cpp pads n_ctx up to a multiple of 256, so a smaller one could never pick rope_short
PHI3_CTX = 1024


def write_phi3(path) -> None:
    """phi3 (Phi-3.5 / Phi-4-mini style): 2 layers, dim 256, 4 heads / 2 kv heads (head_dim 64), ffn 256.
    - blk.N.attn_qkv.weight fused: rows q (256) then k (128) then v (128).
    - blk.N.ffn_up.weight fused, 2*ffn rows: llama.cpp runs it through LLM_FFN_SWIGLU = ggml_swiglu (not
      swapped), i.e. silu(first half) * second half: rows 0..ffn-1 are the GATE, rows ffn..2ffn-1 the UP
      (HF Phi3MLP: gate, up = gate_up_proj(x).chunk(2); up * act(gate)).
    - partial rotary: rope.dimension_count 48 of head_dim 64 (NeoX rotation of the first 48 dims of each
      head, pairs (i, i+24); dims 48..63 pass through).
    - LongRoPE: rope_factors_short.weight / rope_factors_long.weight, 24 F32 each; context_length 1024,
      rope.scaling.original_context_length 256 and rope.scaling.attn_factor
      sqrt(1 + ln(1024/256)/ln(256)) = 1.1180 as convert_hf_to_gguf.py (Phi3MiniModel) writes them. llama.cpp
      picks rope_long when the context's n_ctx per sequence > original_context_length, else rope_short
      (n_ctx is first padded up to a multiple of 256: n_ctx 256 -> short, 512 -> long),
      for the whole context (not per position), and multiplies the RoPE mscale by attn_factor always
      (cparams.yarn_attn_factor *= hparams.rope_attn_factor): rotated q and k components are scaled by
      it, so rotated-part scores by attn_factor^2; the 16 non-rotated dims are not scaled.
    - phi3.attention.sliding_window 16 as real files carry one (Phi-3-mini-4k: 2047): llama.cpp DISABLES
      sliding-window attention for phi3 (load_arch_hparams: "Phi SWA is currently disabled", n_swa = 0).
    - attention scale 1/sqrt(head_dim) (applied to q before attention). Untied output.
    Types: Q5_K_M-like: Q5_K, with Q6_K ffn_down (more_bits layers) and output, token_embd Q5_K."""
    n_layer, dim, n_head, n_kv, ffn, rope_dim = 2, 256, 4, 2, 256, 48
    hd = dim // n_head
    r = _Init(4)
    w = gguf.GGUFWriter(str(path), "phi3")
    _hparams(w, "phi3", n_layer=n_layer, n_ctx=PHI3_CTX, dim=dim, ffn=ffn, n_head=n_head, n_kv=n_kv,
             rope_dim=rope_dim, eps=1e-5)
    w.add_rope_scaling_orig_ctx_len(PHI3_ORIG_CTX)
    w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(PHI3_CTX / PHI3_ORIG_CTX) / math.log(PHI3_ORIG_CTX)))
    w.add_sliding_window(16)
    vocab = _gpt2_vocab(w, ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"], bos=0, eos=4,
                        template=PHI3_TEMPLATE)
    half = rope_dim // 2
    # LongRoPE factors divide the frequencies; short near 1, long ramping up to ~16 for the slow pairs
    _add(w, "rope_factors_short.weight", 1.0 + 0.05 * np.arange(half) / half + 0.02 * r.vec(half))
    _add(w, "rope_factors_long.weight", np.geomspace(1.0, 16.0, half) * (1 + 0.02 * r.vec(half)))
    _add(w, "token_embd.weight", r.embd(vocab, dim), T.Q5_K)
    for i in range(n_layer):
        p = f"blk.{i}."
        _add(w, p + "attn_norm.weight", r.norm(dim))
        qkv = np.concatenate([r.mat(n_head * hd, dim, 1.5), r.mat(n_kv * hd, dim, 1.5), r.mat(n_kv * hd, dim)])
        _add(w, p + "attn_qkv.weight", qkv, T.Q5_K)
        _add(w, p + "attn_output.weight", r.mat(dim, n_head * hd), T.Q5_K)
        _add(w, p + "ffn_norm.weight", r.norm(dim))
        gate_up = np.concatenate([r.mat(ffn, dim, 2), r.mat(ffn, dim)])  # gate rows first, then up
        _add(w, p + "ffn_up.weight", gate_up, T.Q5_K)
        _add(w, p + "ffn_down.weight", r.mat(dim, ffn), T.Q6_K if _more_bits(i, n_layer) else T.Q5_K)
    _add(w, "output_norm.weight", r.norm(dim))
    _add(w, "output.weight", r.mat(vocab, dim, 2.5), T.Q6_K)
    _finish(w)


def write_gemma2(path) -> None:
    """gemma2: 4 layers, dim 256, 4 heads / 2 kv heads, head_dim 128 (key_length; q is 512 wide, like
    Gemma-2-2B's head_dim 256 > dim/n_head), ffn 512, SentencePiece vocabulary (tiny_models.spm_vocab).
    llama.cpp's gemma2:
    - embeddings scaled by sqrt(dim) = 16; tied output (token_embd; an output.weight would be rejected).
    - sliding window: swa_type STANDARD, pattern 2 (attention.sliding_window_pattern not set): layer il is
      sliding when il % 2 == 0, i.e. layers 0 and 2 sliding, 1 and 3 global. window = attention.sliding_window
      = 8 here (default 4096): a query at position p sees keys at positions p-7 .. p (masked when p - p_k >= 8).
    - attention scale: q scaled by 1/sqrt(head_dim) = 1/sqrt(128) for every size except 27B (n_layer 46:
      1/sqrt(dim/n_head)). No GGUF key controls it (query_pre_attn_scalar is not stored).
    - attn_logit_softcapping 50: scores = 50*tanh(scores/50) before the mask/softmax;
      final_logit_softcapping 30: logits = 30*tanh(logits/30).
    - norms: attn_norm, post_attention_norm (on the attention output, before the residual add), ffn_norm,
      post_ffw_norm (on the FFN output, before the add); weights used as stored (the converter adds Gemma's
      +1). FFN: gelu (tanh approximation, ggml_gelu)(gate) * up. NeoX RoPE, base 10000.
    Post norms x3 (with a 0.06 embedding scale) so the layers outweigh the (sqrt(dim)-scaled, tied) embedding of the current token.
    Types: Q4_K_M-like with Q6_K tied token_embd."""
    n_layer, dim, n_head, n_kv, hd, ffn = 4, 256, 4, 2, 128, 512
    r = _Init(5)
    w = gguf.GGUFWriter(str(path), "gemma2")
    _hparams(w, "gemma2", n_layer=n_layer, n_ctx=512, dim=dim, ffn=ffn, n_head=n_head, n_kv=n_kv, head_dim=hd)
    w.add_sliding_window(8)
    w.add_attn_logit_softcapping(50.0)
    w.add_final_logit_softcapping(30.0)
    vocab = _spm_vocab(w)
    _add(w, "token_embd.weight", r.embd(vocab, dim, 0.06), T.Q6_K)  # x 16 at the input
    for i in range(n_layer):
        p = f"blk.{i}."
        _add(w, p + "attn_norm.weight", r.norm(dim))
        _attention(w, r, p, dim, n_head, n_kv, hd, T.Q4_K, qk=1.5, vtype=_q4km("attn_v", i, n_layer))
        _add(w, p + "post_attention_norm.weight", 3 * r.norm(dim))
        _add(w, p + "ffn_norm.weight", r.norm(dim))
        _add(w, p + "ffn_gate.weight", r.mat(ffn, dim, 2), T.Q4_K)
        _add(w, p + "ffn_up.weight", r.mat(ffn, dim), T.Q4_K)
        _add(w, p + "ffn_down.weight", r.mat(dim, ffn), _q4km("ffn_down", i, n_layer))
        _add(w, p + "post_ffw_norm.weight", 3 * r.norm(dim))
    _add(w, "output_norm.weight", 2.5 * r.norm(dim))  # logits std ~2.4, under the final softcap 30
    _finish(w)


def write_olmo2(path) -> None:
    """olmo2: 3 layers, dim 256, 4 heads / 2 kv heads (head_dim 64), ffn 512, all F16 (norms F32).
    No pre-norms: the layer is  h = x + attn_post_norm(attn(x));  out = h + ffn_post_norm(ffn(h)).
    Tensors blk.N.post_attention_norm.weight (ATTN_POST_NORM) and blk.N.post_ffw_norm.weight (FFN_POST_NORM).
    q/k RMS norms over the whole projection, before the reshape to heads and before RoPE:
    attn_q_norm size n_head*head_dim = 256, attn_k_norm size n_kv*head_dim = 128. NeoX RoPE.
    Untied output (llama.cpp requires output.weight for olmo2). No sliding window key (OLMo 3 has one)."""
    n_layer, dim, n_head, n_kv, ffn = 3, 256, 4, 2, 512
    hd = dim // n_head
    r = _Init(6)
    w = gguf.GGUFWriter(str(path), "olmo2")
    _hparams(w, "olmo2", n_layer=n_layer, n_ctx=512, dim=dim, ffn=ffn, n_head=n_head, n_kv=n_kv, base=500000.0)
    vocab = _gpt2_vocab(w, ["<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>"], bos=0, eos=0, pre="dbrx")
    _add(w, "token_embd.weight", r.embd(vocab, dim), T.F16)
    for i in range(n_layer):
        p = f"blk.{i}."
        _attention(w, r, p, dim, n_head, n_kv, hd, T.F16, qk=2,
                   between=[("attn_q_norm.weight", lambda: 1.5 * r.norm(n_head * hd)),
                            ("attn_k_norm.weight", lambda: 1.5 * r.norm(n_kv * hd))])
        _add(w, p + "post_attention_norm.weight", 0.5 * r.norm(dim))
        _add(w, p + "ffn_gate.weight", r.mat(ffn, dim), T.F16)
        _add(w, p + "ffn_up.weight", r.mat(ffn, dim), T.F16)
        _add(w, p + "ffn_down.weight", r.mat(dim, ffn), T.F16)
        _add(w, p + "post_ffw_norm.weight", 0.5 * r.norm(dim))
    _add(w, "output_norm.weight", r.norm(dim))
    _add(w, "output.weight", r.mat(vocab, dim, 4), T.F16)
    _finish(w)


def _moe_layer(w, r: _Init, p: str, i: int, n_layer: int, dim: int, n_expert: int, ffn_exp: int, types: dict,
               router: float, down: float = 1.0) -> None:
    _add(w, p + "ffn_gate_inp.weight", r.mat(n_expert, dim, router))  # router, F32 as llama-quantize leaves it
    _add(w, p + "ffn_gate_exps.weight", r.exps(n_expert, ffn_exp, dim), types["gate"])
    _add(w, p + "ffn_up_exps.weight", r.exps(n_expert, ffn_exp, dim), types["up"])
    down_t = types["down"](i, n_layer) if callable(types["down"]) else types["down"]
    _add(w, p + "ffn_down_exps.weight", r.exps(n_expert, dim, ffn_exp, down), down_t)


def write_qwen3moe(path) -> None:
    """qwen3moe: 3 layers, dim 256, 4 heads / 2 kv heads, head_dim 128 (q 512 wide, like Qwen3-30B-A3B),
    per-head q/k norms (size 128), NeoX RoPE base 1e6; MoE in every layer: 8 experts, 2 used, expert FFN 256
    (expert_feed_forward_length), router blk.N.ffn_gate_inp.weight F32 (n_expert, dim), experts 3-D
    blk.N.ffn_{gate,up,down}_exps (numpy (n_expert, rows, cols)). No shared expert.
    Routing in llama.cpp (build_moe_ffn, SOFTMAX gating): p = softmax(router logits over all 8 experts),
    take the top 2, and RENORMALISE their weights to sum 1 (qwen3moe passes norm_w = true, hard-coded, no
    GGUF key read); out = sum_k w_k * down_k(silu(gate_k x) * up_k x). Untied output.
    Types: Q4_K_M-like: Q4_K, Q6_K attn_v/ffn_down_exps on more_bits layers, output Q6_K."""
    n_layer, dim, n_head, n_kv, hd, n_expert, n_used, ffn_exp = 3, 256, 4, 2, 128, 8, 2, 256
    r = _Init(7)
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    _hparams(w, "qwen3moe", n_layer=n_layer, n_ctx=512, dim=dim, ffn=768, n_head=n_head, n_kv=n_kv, head_dim=hd,
             base=1e6)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    w.add_expert_feed_forward_length(ffn_exp)
    vocab = _gpt2_vocab(w, ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"], pre="qwen2",
                        eos=2, template=QWEN3_TEMPLATE)
    _add(w, "token_embd.weight", r.embd(vocab, dim), T.Q4_K)
    for i in range(n_layer):
        p = f"blk.{i}."
        _add(w, p + "attn_norm.weight", r.norm(dim))
        _attention(w, r, p, dim, n_head, n_kv, hd, T.Q4_K, vtype=_q4km("attn_v", i, n_layer),
                   between=[("attn_q_norm.weight", lambda: 0.45 * r.norm(hd)),
                            ("attn_k_norm.weight", lambda: 0.45 * r.norm(hd))])
        _add(w, p + "ffn_norm.weight", r.norm(dim))
        _moe_layer(w, r, p, i, n_layer, dim, n_expert, ffn_exp,
                   {"gate": T.Q4_K, "up": T.Q4_K, "down": lambda i, n: _q4km("ffn_down_exps", i, n)}, router=10, down=0.4)
    _add(w, "output_norm.weight", r.norm(dim))
    _add(w, "output.weight", r.mat(vocab, dim, 3), T.Q6_K)
    _finish(w)


def write_olmoe(path) -> None:
    """olmoe: 2 layers, dim 256, 4 heads / 4 kv heads (OLMoE has no GQA, and llama.cpp sizes attn_k_norm
    n_embd), head_dim 64; pre-norms (attn_norm, ffn_norm) and q/k RMS norms over the WHOLE projection
    (attn_q_norm and attn_k_norm both size 256), before the reshape to heads and RoPE. NeoX RoPE.
    MoE: 8 experts, 2 used, expert FFN = feed_forward_length = 256 (olmoe reads n_ff for the experts).
    Routing: softmax over all experts, top 2, NOT renormalised (olmoe passes norm_w = false; OLMoE's
    norm_topk_prob is false). Untied output. All Q8_0."""
    n_layer, dim, n_head, n_kv, n_expert, n_used, ffn_exp = 2, 256, 4, 4, 8, 2, 256
    hd = dim // n_head
    r = _Init(8)
    w = gguf.GGUFWriter(str(path), "olmoe")
    _hparams(w, "olmoe", n_layer=n_layer, n_ctx=512, dim=dim, ffn=ffn_exp, n_head=n_head, n_kv=n_kv, eps=1e-5)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    vocab = _gpt2_vocab(w, ["<|endoftext|>", "<|padding|>", "<|im_start|>", "<|im_end|>"], bos=0, eos=0,
                        pre="olmo")
    _add(w, "token_embd.weight", r.embd(vocab, dim), T.Q8_0)
    for i in range(n_layer):
        p = f"blk.{i}."
        _add(w, p + "attn_norm.weight", r.norm(dim))
        _attention(w, r, p, dim, n_head, n_kv, hd, T.Q8_0,
                   between=[("attn_q_norm.weight", lambda: 0.5 * r.norm(n_head * hd)),
                            ("attn_k_norm.weight", lambda: 0.5 * r.norm(n_kv * hd))])
        _add(w, p + "ffn_norm.weight", r.norm(dim))
        _moe_layer(w, r, p, i, n_layer, dim, n_expert, ffn_exp, {"gate": T.Q8_0, "up": T.Q8_0, "down": T.Q8_0},
                   router=6)
    _add(w, "output_norm.weight", r.norm(dim))
    _add(w, "output.weight", r.mat(vocab, dim, 3), T.Q8_0)
    _finish(w)


def write_qwen2moe(path) -> None:
    """qwen2moe (Qwen1.5-MoE / Qwen2-57B-A14B): 2 layers, dim 256, 4 heads / 2 kv heads (head_dim 64), q/k/v
    biases, NeoX RoPE base 1e6. MoE: 6 experts, 2 used, expert FFN 256 (expert_feed_forward_length), routing
    softmax -> top 2, NOT renormalised (qwen2moe passes norm_w = false). Plus a shared expert of FFN 512
    (expert_shared_feed_forward_length; ffn_gate_shexp/ffn_up_shexp/ffn_down_shexp) whose output is
    multiplied by sigmoid(ffn_gate_inp_shexp . x) (ffn_gate_inp_shexp: F32 vector of size dim; x is the
    ffn_norm output) and added to the routed experts' sum. Untied output.
    Types: mixed: attention Q8_0, experts Q4_K with ffn_down_exps Q6_K, shared expert Q5_K, token_embd
    Q8_0, output Q6_K."""
    n_layer, dim, n_head, n_kv, n_expert, n_used, ffn_exp, ffn_sh = 2, 256, 4, 2, 6, 2, 256, 512
    hd = dim // n_head
    r = _Init(9)
    w = gguf.GGUFWriter(str(path), "qwen2moe")
    _hparams(w, "qwen2moe", n_layer=n_layer, n_ctx=512, dim=dim, ffn=ffn_sh, n_head=n_head, n_kv=n_kv, base=1e6)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    w.add_expert_feed_forward_length(ffn_exp)
    w.add_expert_shared_feed_forward_length(ffn_sh)
    vocab = _gpt2_vocab(w, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], pre="qwen2", eos=2)
    _add(w, "token_embd.weight", r.embd(vocab, dim), T.Q8_0)
    for i in range(n_layer):
        p = f"blk.{i}."
        _add(w, p + "attn_norm.weight", r.norm(dim))
        _attention(w, r, p, dim, n_head, n_kv, hd, T.Q8_0, qk=1.2,
                   between=[("attn_q.bias", lambda: r.vec(n_head * hd)),
                            ("attn_k.bias", lambda: r.vec(n_kv * hd, 3)),  # Qwen's k biases are large
                            ("attn_v.bias", lambda: r.vec(n_kv * hd, 0.3))])
        _add(w, p + "ffn_norm.weight", r.norm(dim))
        _moe_layer(w, r, p, i, n_layer, dim, n_expert, ffn_exp, {"gate": T.Q4_K, "up": T.Q4_K, "down": T.Q6_K},
                   router=6)
        _add(w, p + "ffn_gate_inp_shexp.weight", r.vec(dim, 2 / np.sqrt(dim)))
        _add(w, p + "ffn_gate_shexp.weight", r.mat(ffn_sh, dim), T.Q5_K)
        _add(w, p + "ffn_up_shexp.weight", r.mat(ffn_sh, dim), T.Q5_K)
        _add(w, p + "ffn_down_shexp.weight", r.mat(dim, ffn_sh), T.Q5_K)
    _add(w, "output_norm.weight", r.norm(dim))
    _add(w, "output.weight", r.mat(vocab, dim, 3), T.Q6_K)
    _finish(w)


# ---------------------------------------------------------------------------------------------- benchmark

def _random_blocks(rng: np.random.Generator, shape: tuple, qtype: T, sigma: float, pool: dict) -> np.ndarray:
    """Quantized bytes for a tensor of (numpy) shape `shape`, built from a pool of genuinely quantized
    random blocks (N(0, sigma^2) values), drawn at random: valid blocks with realistic scales, at memcpy
    speed. Returns uint8 of shape (*shape[:-1], bytes per row)."""
    block, type_size = GGML_QUANT_SIZES[qtype]
    key = (qtype, sigma)
    if key not in pool:
        x = np.random.default_rng(1234).standard_normal((64, block * 256)).astype(np.float32) * sigma
        pool[key] = _quantize(x, qtype).reshape(-1, type_size)  # 16384 blocks
    blocks = pool[key]
    n_blocks = int(np.prod(shape)) // block
    idx = rng.integers(0, len(blocks), size=n_blocks)
    return blocks[idx].reshape(*shape[:-1], shape[-1] // block * type_size)


def _pooled_writers(w: gguf.GGUFWriter, rng: np.random.Generator, pool: dict):
    """(q, f32) for the benchmark models: q(name, shape, qtype, mult) adds a quantized tensor of N(0,
    (mult / sqrt(cols))^2) values from pooled blocks (_random_blocks); f32(name, x) a float32 one."""
    def q(name: str, shape: tuple, qtype: T, mult: float = 1.0) -> None:
        b = _random_blocks(rng, shape, qtype, round(mult / np.sqrt(shape[-1]), 6), pool)
        w.add_tensor(name, b, raw_shape=b.shape, raw_dtype=qtype)

    def f32(name: str, x: np.ndarray) -> None:
        w.add_tensor(name, np.asarray(x, np.float32))

    return q, f32


def write_qwen3moe_bench(path) -> None:
    """A realistic-shape random qwen3moe for benchmarks only (not in the golden file): 16 layers, dim 1024,
    16 heads / 4 kv heads, head_dim 128 (q 2048 wide), 32 experts, 4 used, expert FFN 512, vocabulary
    32768 (GPT-2 bytes plus filler tokens), untied output; Q4_K_M-like: Q4_K everywhere but Q6_K for
    attn_v, ffn_down_exps and output. About 0.6 GB. The quantized blocks are drawn from a pool of real
    quantized random blocks rather than quantizing every tensor, so writing takes seconds."""
    n_layer, dim, n_head, n_kv, hd, n_expert, n_used, ffn_exp = 16, 1024, 16, 4, 128, 32, 4, 512
    rng = np.random.default_rng(10)
    pool: dict = {}
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    _hparams(w, "qwen3moe_bench", n_layer=n_layer, n_ctx=4096, dim=dim, ffn=3072, n_head=n_head, n_kv=n_kv,
             head_dim=hd, base=1e6)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    w.add_expert_feed_forward_length(ffn_exp)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    vocab = _gpt2_vocab(w, specials, pre="qwen2", eos=2, template=QWEN3_TEMPLATE,
                        n_extra=32768 - len(specials) - 256 - len(GPT2_MERGES))

    q, f32 = _pooled_writers(w, rng, pool)

    q("token_embd.weight", (vocab, dim), T.Q4_K, 0.5 * np.sqrt(dim))
    for i in range(n_layer):
        p = f"blk.{i}."
        f32(p + "attn_norm.weight", 1 + 0.1 * rng.standard_normal(dim))
        q(p + "attn_q.weight", (n_head * hd, dim), T.Q4_K, 2)
        q(p + "attn_k.weight", (n_kv * hd, dim), T.Q4_K, 2)
        q(p + "attn_v.weight", (n_kv * hd, dim), T.Q6_K)
        f32(p + "attn_q_norm.weight", 1 + 0.1 * rng.standard_normal(hd))
        f32(p + "attn_k_norm.weight", 1 + 0.1 * rng.standard_normal(hd))
        q(p + "attn_output.weight", (dim, n_head * hd), T.Q4_K)
        f32(p + "ffn_norm.weight", 1 + 0.1 * rng.standard_normal(dim))
        f32(p + "ffn_gate_inp.weight", rng.standard_normal((n_expert, dim)) * (3 / np.sqrt(dim)))
        q(p + "ffn_gate_exps.weight", (n_expert, ffn_exp, dim), T.Q4_K)
        q(p + "ffn_up_exps.weight", (n_expert, ffn_exp, dim), T.Q4_K)
        q(p + "ffn_down_exps.weight", (n_expert, dim, ffn_exp), T.Q6_K)
    f32("output_norm.weight", 1 + 0.1 * rng.standard_normal(dim))
    q("output.weight", (vocab, dim), T.Q6_K, 4)
    _finish(w)


def _lfm2_mixer(w, r: "_Init", p: str, i: int, n_layer: int, conv: bool, dim: int, n_head: int, n_kv: int, hd: int,
                taps: int) -> None:
    """An LFM2 layer's mixer: a gated short convolution (Q4_K in, F32 taps, out as attn_v on llama.cpp's
    use_more_bits layers) or qwen3-style attention."""
    if conv:
        _add(w, p + "shortconv.in_proj.weight", r.mat(3 * dim, dim, 1.5), T.Q4_K)
        _add(w, p + "shortconv.conv.weight", r.mat(dim, taps, 0.8))
        _add(w, p + "shortconv.out_proj.weight", r.mat(dim, dim), _q4km("attn_v", i, n_layer))
    else:
        _qk_norm_attention(w, r, p, dim, n_head, n_kv, hd, _q4km("attn_v", i, n_layer))


def write_lfm2(path) -> None:
    """lfm2 (LFM2/LFM2.5 dense): 5 layers, dim 256, layers 0, 2 and 4 gated short convolutions (3 taps: a
    state of 2 inputs per sequence), 1 and 3 attention (4 heads / 2 kv heads, head_dim 64, per-head q/k
    RMS norms, NeoX RoPE base 1e6), which the per-layer head_count_kv says (0: a convolution); SiLU-gated
    FFN 512 in every layer; the final norm is token_embd_norm; tied embedding. Q4_K_M-like matrices, the
    taps F32 (as llama-quantize leaves them). The last layer is a convolution, so the rows that get logits
    are chosen after one (llama.cpp's inp_out_ids)."""
    n_layer, dim, n_head, n_kv, hd, ffn, taps = 5, 256, 4, 2, 64, 512, 3
    conv = [i % 2 == 0 for i in range(n_layer)]
    r = _Init(10)
    w = gguf.GGUFWriter(str(path), "lfm2")
    _hparams(w, "lfm2", n_layer=n_layer, n_ctx=512, dim=dim, ffn=ffn, n_head=n_head,
             n_kv=[0 if c else n_kv for c in conv], base=1e6, eps=1e-5)  # a head_count_kv per layer
    w.add_shortconv_l_cache(taps)
    vocab = _gpt2_vocab(w, ["<|pad|>", "<|startoftext|>", "<|im_start|>", "<|im_end|>"], pre="lfm2", bos=1, eos=3,
                        add_bos=True)
    _add(w, "token_embd.weight", r.embd(vocab, dim, 0.12), T.Q6_K)
    for i in range(n_layer):
        p = f"blk.{i}."
        _add(w, p + "attn_norm.weight", r.norm(dim))
        _lfm2_mixer(w, r, p, i, n_layer, conv[i], dim, n_head, n_kv, hd, taps)
        _swiglu(w, r, p, dim, ffn, _q4km("ffn_down", i, n_layer))
    _add(w, "token_embd_norm.weight", 1.6 * r.norm(dim))
    _finish(w)


def write_lfm2moe(path) -> None:
    """lfm2moe (LFM2-8B-A1B's layer kinds): write_lfm2's layers (convolutions 0, 2 and 4, attention 1 and
    3) with the first layer's FFN dense (leading_dense_block_count 1, FFN 512) and experts in the others:
    8 experts, 4 used, expert FFN 256, sigmoid gating (expert_gating_func 2), the experts chosen by
    probability plus a per-expert selection bias (exp_probs_b), their weights renormalised; tied embedding.
    Sigmoid scores lie closer together than softmax ones, so rounding flips near-tied choices more often: 4
    experts a token (a flip swaps a quarter of the output), the router at x2, the experts' down projections at
    x0.8 and a seed without a near-tie at a golden prompt keep the check within the tolerance (the selection
    bias ignored moves log-probabilities by 1.5, softmax gating by 2.5)."""
    n_layer, dim, n_head, n_kv, hd, ffn, taps = 5, 256, 4, 2, 64, 512, 3
    n_expert, n_used, ffn_exp = 8, 4, 256
    conv = [i % 2 == 0 for i in range(n_layer)]
    r = _Init(29)
    w = gguf.GGUFWriter(str(path), "lfm2moe")
    _hparams(w, "lfm2moe", n_layer=n_layer, n_ctx=512, dim=dim, ffn=ffn, n_head=n_head,
             n_kv=[0 if c else n_kv for c in conv], base=1e6, eps=1e-5)
    w.add_shortconv_l_cache(taps)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    w.add_expert_feed_forward_length(ffn_exp)
    w.add_leading_dense_block_count(1)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    vocab = _gpt2_vocab(w, ["<|pad|>", "<|startoftext|>", "<|im_start|>", "<|im_end|>"], pre="lfm2", bos=1, eos=3,
                        add_bos=True)
    _add(w, "token_embd.weight", r.embd(vocab, dim, 0.12), T.Q6_K)
    for i in range(n_layer):
        p = f"blk.{i}."
        _add(w, p + "attn_norm.weight", r.norm(dim))
        _lfm2_mixer(w, r, p, i, n_layer, conv[i], dim, n_head, n_kv, hd, taps)
        if i == 0:
            _swiglu(w, r, p, dim, ffn, _q4km("ffn_down", i, n_layer))
            continue
        _add(w, p + "ffn_norm.weight", r.norm(dim))
        _moe_layer(w, r, p, i, n_layer, dim, n_expert, ffn_exp,
                   {"gate": T.Q4_K, "up": T.Q4_K, "down": lambda i, n: _q4km("ffn_down_exps", i, n)}, router=2,
                   down=0.8)
        _add(w, p + "exp_probs_b.bias", r.vec(n_expert, 0.1))
    _add(w, "token_embd_norm.weight", 1.6 * r.norm(dim))
    _finish(w)


def _mamba2_hparams(w: gguf.GGUFWriter, n_layer: int, dim: int, inner: int, n_state: int, heads: int, groups: int,
                    taps: int) -> None:
    # what convert_hf_to_gguf writes for a Mamba2 model (head_count 0, feed_forward_length 0)
    w.add_context_length(1 << 20)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_block_count(n_layer)
    w.add_ssm_conv_kernel(taps)
    w.add_ssm_inner_size(inner)
    w.add_ssm_state_size(n_state)
    w.add_ssm_time_step_rank(heads)
    w.add_ssm_group_count(groups)
    w.add_layer_norm_rms_eps(1e-5)


def _mamba2_layer(w, r: "_Init", p: str, i: int, n_layer: int, dim: int, inner: int, n_state: int, heads: int,
                  groups: int, taps: int, norm: bool = True) -> None:
    """A Mamba2 mixer's tensors (write_mamba2's draws, in its order): Q4_K in/out projections (Q6_K on the
    use_more_bits layers' out), the small tensors F32."""
    conv = inner + 2 * groups * n_state
    _add(w, p + "ssm_in.weight", r.mat(inner + conv + heads, dim, 1.5), T.Q4_K)
    _add(w, p + "ssm_conv1d.weight", r.mat(conv, taps, 1.0))
    _add(w, p + "ssm_conv1d.bias", r.vec(conv, 0.1))
    _add(w, p + "ssm_dt.bias", r.vec(heads, 0.5) - 1.0)
    _add(w, p + "ssm_a", -np.exp(r.vec(heads, 0.5)).reshape(heads, 1))
    _add(w, p + "ssm_d", (1 + 0.1 * r.vec(heads)).reshape(heads, 1))
    if norm:
        _add(w, p + "ssm_norm.weight", r.norm(inner).reshape(groups, inner // groups))
    _add(w, p + "ssm_out.weight", r.mat(dim, inner, 1.5), _q4km("ffn_down", i, n_layer))


def write_mamba2(path) -> None:
    """mamba2: 3 layers, dim 256, Mamba2 mixers only (no attention, no FFN): d_inner 512 in 8 heads of 64,
    d_state 32 in 2 groups of B and C, 4 convolution taps with a bias, dt biases, A = -exp(.) per head (as
    the converter stores A_log), D per head, a grouped RMS norm (2 groups of 256) on silu(z) y; head_count
    0, as convert_hf_to_gguf writes it; untied output. Q4_K in/out projections (Q6_K on the use_more_bits
    layers' out), the small tensors F32 (llama-quantize keeps ssm_conv1d)."""
    n_layer, dim, inner, n_state, heads, groups, taps = 3, 256, 512, 32, 8, 2, 4
    r = _Init(11)
    w = gguf.GGUFWriter(str(path), "mamba2")
    _mamba2_hparams(w, n_layer, dim, inner, n_state, heads, groups, taps)
    vocab = _gpt2_vocab(w, ["<|endoftext|>", "<|padding|>"], eos=0, template=None)
    _add(w, "token_embd.weight", r.embd(vocab, dim, 0.5), T.Q6_K)
    for i in range(n_layer):
        p = f"blk.{i}."
        _add(w, p + "attn_norm.weight", r.norm(dim))
        _mamba2_layer(w, r, p, i, n_layer, dim, inner, n_state, heads, groups, taps)
    _add(w, "output_norm.weight", r.norm(dim))
    _add(w, "output.weight", r.mat(vocab, dim, 2.0), T.Q6_K)
    _finish(w)


def write_granitehybrid(path) -> None:
    """granitehybrid (Granite 4.0 H Tiny/Small's shape of layer): 4 layers, dim 256, layers 0, 2 and 3
    Mamba2 mixers (d_inner 512 in 8 heads of 64, d_state 32 in 2 groups, 4 taps), layer 1 attention (4
    heads / 2 kv heads of 64, no RoPE: rope.scaling.finetuned false, as the converter writes Granite 4 H),
    per-layer head_count_kv (0: Mamba2); in every layer a mixture of experts (8 experts, 2 used, expert FFN
    256, softmax routing, renormalised weights) plus an ungated shared expert (FFN 256); Granite's
    multipliers: embedding 8, residual 0.5, attention 0.09 (not 1/sqrt(64)), logits divided by 4. Untied
    output; Q4_K_M-like matrices, SSM tensors and the router F32."""
    n_layer, dim, n_head, n_kv, hd = 4, 256, 4, 2, 64
    inner, n_state, heads, groups, taps = 512, 32, 8, 2, 4
    n_expert, n_used, ffn_exp, ffn_sh = 8, 2, 256, 256
    attn = {1}
    r = _Init(14)
    w = gguf.GGUFWriter(str(path), "granitehybrid")
    _hparams(w, "granitehybrid", n_layer=n_layer, n_ctx=4096, dim=dim, ffn=ffn_exp, n_head=n_head,
             n_kv=[n_kv if i in attn else 0 for i in range(n_layer)], eps=1e-5)
    w.add_ssm_conv_kernel(taps)
    w.add_ssm_inner_size(inner)
    w.add_ssm_state_size(n_state)
    w.add_ssm_time_step_rank(heads)
    w.add_ssm_group_count(groups)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    w.add_expert_shared_feed_forward_length(ffn_sh)
    w.add_embedding_scale(8.0)
    w.add_residual_scale(0.5)
    w.add_attention_scale(0.09)
    w.add_logit_scale(4.0)
    w.add_rope_scaling_finetuned(False)
    vocab = _gpt2_vocab(w, ["<|end_of_text|>", "<|start_of_role|>", "<|end_of_role|>"], pre="refact", eos=0,
                        template=GRANITE_TEMPLATE)
    _add(w, "token_embd.weight", r.embd(vocab, dim, 0.06), T.Q6_K)
    for i in range(n_layer):
        p = f"blk.{i}."
        _add(w, p + "attn_norm.weight", r.norm(dim))
        if i in attn:
            _attention(w, r, p, dim, n_head, n_kv, hd, T.Q4_K, vtype=_q4km("attn_v", i, n_layer), o_mult=1.5)
        else:
            _mamba2_layer(w, r, p, i, n_layer, dim, inner, n_state, heads, groups, taps)
        _add(w, p + "ffn_norm.weight", r.norm(dim))
        _moe_layer(w, r, p, i, n_layer, dim, n_expert, ffn_exp,
                   {"gate": T.Q4_K, "up": T.Q4_K, "down": lambda i, n: _q4km("ffn_down_exps", i, n)}, router=5)
        _shared_expert(w, r, p, i, n_layer, dim, ffn_sh, gated=False)
    _add(w, "output_norm.weight", r.norm(dim))
    _add(w, "output.weight", r.mat(vocab, dim, 8.0), T.Q6_K)
    _finish(w)


def _granite_head(w, r: "_Init", dim: int) -> int:
    """Granite 3.x's multipliers (embedding 8, residual 0.5, attention 0.09, logits / 4), its vocabulary and
    template, and a Q6_K token_embd; returns the vocabulary size."""
    w.add_embedding_scale(8.0)
    w.add_residual_scale(0.5)
    w.add_attention_scale(0.09)
    w.add_logit_scale(4.0)
    vocab = _gpt2_vocab(w, ["<|end_of_text|>", "<|start_of_role|>", "<|end_of_role|>"], pre="refact", eos=0,
                        template=GRANITE_TEMPLATE)
    _add(w, "token_embd.weight", r.embd(vocab, dim, 0.06), T.Q6_K)
    return vocab


def write_granite(path) -> None:
    """granite (Granite 3.x dense): the llama layer with Granite's multipliers: embedding 8, residual 0.5,
    attention 0.09 (not 1/sqrt(64)), logits divided by 4; RoPE (rope.scaling.finetuned absent: on, as Granite
    3.x files have it). 3 layers, dim 256, 4 heads / 2 kv heads of 64, ffn 512, normal RoPE base 10000,
    untied output (x8, so the logits, divided by 4, are not flat), Q4_K_M-like matrices, Q6_K token_embd
    and output."""
    n_layer, dim, n_head, n_kv, ffn = 3, 256, 4, 2, 512
    hd = dim // n_head
    r = _Init(41)
    w = gguf.GGUFWriter(str(path), "granite")
    _hparams(w, "granite", n_layer=n_layer, n_ctx=4096, dim=dim, ffn=ffn, n_head=n_head, n_kv=n_kv, eps=1e-5)
    vocab = _granite_head(w, r, dim)
    for i in range(n_layer):
        p = f"blk.{i}."
        _add(w, p + "attn_norm.weight", r.norm(dim))
        _attention(w, r, p, dim, n_head, n_kv, hd, T.Q4_K, vtype=_q4km("attn_v", i, n_layer), o_mult=1.5)
        _swiglu(w, r, p, dim, ffn, _q4km("ffn_down", i, n_layer))
    _add(w, "output_norm.weight", r.norm(dim))
    _add(w, "output.weight", r.mat(vocab, dim, 8.0), T.Q6_K)
    _finish(w)


def write_mistral3(path) -> None:
    """mistral3 (Ministral 3): the llama layer with YaRN RoPE (factor 4 from an original context of 16, beta
    fast 32 and slow 1, as Ministral 3 files write them; the small original context puts the ramp over the
    middle pairs of this head and the golden prompts past it) and Llama 4's attention temperature 0.1 on the
    queries from position 16 on. 3 layers, dim 256, 4 heads / 1 kv head of 64, ffn 512, normal RoPE base
    1e6, untied output, Q4_K_M-like matrices."""
    n_layer, dim, n_head, n_kv, ffn = 3, 256, 4, 1, 512
    hd = dim // n_head
    r = _Init(47)
    w = gguf.GGUFWriter(str(path), "mistral3")
    _hparams(w, "mistral3", n_layer=n_layer, n_ctx=4096, dim=dim, ffn=ffn, n_head=n_head, n_kv=n_kv, base=1e6,
             eps=1e-5)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(4.0)
    w.add_rope_scaling_orig_ctx_len(16)
    w.add_rope_scaling_yarn_beta_fast(32.0)
    w.add_rope_scaling_yarn_beta_slow(1.0)
    w.add_attn_temperature_scale(0.1)
    vocab = _gpt2_vocab(w, ["<unk>", "<s>", "</s>"], bos=1, eos=2, add_bos=True, template=None)
    _add(w, "token_embd.weight", r.embd(vocab, dim), T.Q4_K)
    for i in range(n_layer):
        p = f"blk.{i}."
        _add(w, p + "attn_norm.weight", r.norm(dim))
        _attention(w, r, p, dim, n_head, n_kv, hd, T.Q4_K, qk=1.2, vtype=_q4km("attn_v", i, n_layer))
        _swiglu(w, r, p, dim, ffn, _q4km("ffn_down", i, n_layer))
    _add(w, "output_norm.weight", r.norm(dim))
    _add(w, "output.weight", r.mat(vocab, dim, 3), T.Q6_K)
    _finish(w)


def write_granitemoe(path) -> None:
    """granitemoe (Granite 3.x MoE): write_granite's layers and multipliers with a mixture of experts in each
    (8 experts, 2 used, expert FFN 256, softmax routing, renormalised weights), no shared expert (as the
    1B-A400M and 3B-A800M files have none)."""
    n_layer, dim, n_head, n_kv = 3, 256, 4, 2
    n_expert, n_used, ffn_exp = 8, 2, 256
    hd = dim // n_head
    r = _Init(43)
    w = gguf.GGUFWriter(str(path), "granitemoe")
    _hparams(w, "granitemoe", n_layer=n_layer, n_ctx=4096, dim=dim, ffn=ffn_exp, n_head=n_head, n_kv=n_kv, eps=1e-5)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    vocab = _granite_head(w, r, dim)
    for i in range(n_layer):
        p = f"blk.{i}."
        _add(w, p + "attn_norm.weight", r.norm(dim))
        _attention(w, r, p, dim, n_head, n_kv, hd, T.Q4_K, vtype=_q4km("attn_v", i, n_layer), o_mult=1.5)
        _add(w, p + "ffn_norm.weight", r.norm(dim))
        _moe_layer(w, r, p, i, n_layer, dim, n_expert, ffn_exp,
                   {"gate": T.Q4_K, "up": T.Q4_K, "down": lambda i, n: _q4km("ffn_down_exps", i, n)}, router=5)
    _add(w, "output_norm.weight", r.norm(dim))
    _add(w, "output.weight", r.mat(vocab, dim, 8.0), T.Q6_K)
    _finish(w)


def write_gpt_oss(path) -> None:
    """gpt-oss (llama.cpp's openai-moe.cpp): 4 layers, dim 256, 4 heads / 2 kv heads of 64, q/k/v and output
    biases, one attention sink per head; layers 0 and 2 sliding-window (window 8, so the golden prompts run past
    it), 1 and 3 full; NeoX RoPE base 150000 with YaRN (factor 4 from an original context of 16, beta fast 32 and
    slow 1: gpt-oss's 32 from 4096 scaled down so the ramp falls over the middle pairs); a mixture of experts in
    every layer after post_attention_norm: 8 experts, 4 used, expert FFN 256, a biased F32 router, the 4 largest
    logits weighted by a softmax over them, gate/up/down with per-expert biases, the clamped SwiGLU (alpha 1.702,
    limit 7). Experts MXFP4 (as gpt-oss ships them), attention, embeddings and output Q8_0; the o200k
    pre-tokenizer's name and harmony's special tokens, the official template (tests/golden/templates)."""
    n_layer, dim, n_head, n_kv, hd = 4, 256, 4, 2, 64
    n_expert, n_used, ffn_exp = 8, 4, 256
    r = _Init(53)
    w = gguf.GGUFWriter(str(path), "gpt-oss")
    _hparams(w, "gpt-oss", n_layer=n_layer, n_ctx=4096, dim=dim, ffn=ffn_exp, n_head=n_head, n_kv=n_kv, head_dim=hd,
             base=150000.0, eps=1e-5)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    w.add_expert_feed_forward_length(ffn_exp)
    w.add_sliding_window(8)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(4.0)
    w.add_rope_scaling_orig_ctx_len(16)
    specials = ["<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>",
                "<|constrain|>"]
    template = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "templates",
                                 "openai-gpt-oss-120b.jinja")).read()
    vocab = _gpt2_vocab(w, specials, pre="gpt-4o", eos=5, template=template)
    _add(w, "token_embd.weight", r.embd(vocab, dim), T.Q8_0)
    for i in range(n_layer):
        p = f"blk.{i}."
        _add(w, p + "attn_norm.weight", r.norm(dim))
        _attention(w, r, p, dim, n_head, n_kv, hd, T.Q8_0, qk=1.2,
                   between=[("attn_q.bias", lambda: r.vec(n_head * hd, 0.1)),
                            ("attn_k.bias", lambda: r.vec(n_kv * hd, 0.1)),
                            ("attn_v.bias", lambda: r.vec(n_kv * hd, 0.1))])
        _add(w, p + "attn_output.bias", r.vec(dim, 0.1))
        _add(w, p + "attn_sinks.weight", r.vec(n_head, 1.0))
        _add(w, p + "post_attention_norm.weight", r.norm(dim))
        _moe_layer(w, r, p, i, n_layer, dim, n_expert, ffn_exp, {"gate": T.MXFP4, "up": T.MXFP4, "down": T.MXFP4},
                   router=3)
        _add(w, p + "ffn_gate_inp.bias", r.vec(n_expert, 0.5))
        _add(w, p + "ffn_gate_exps.bias", r.vec(n_expert * ffn_exp, 0.2).reshape(n_expert, ffn_exp))
        _add(w, p + "ffn_up_exps.bias", r.vec(n_expert * ffn_exp, 0.2).reshape(n_expert, ffn_exp))
        _add(w, p + "ffn_down_exps.bias", r.vec(n_expert * dim, 0.1).reshape(n_expert, dim))
    _add(w, "output_norm.weight", r.norm(dim))
    _add(w, "output.weight", r.mat(vocab, dim, 2), T.Q8_0)
    _finish(w)


def write_gpt_oss_bench(path) -> None:
    """A realistic-shape random gpt-oss for benchmarks only (not in the golden file): gpt-oss-20b's layer (dim
    2880, 64 query heads / 8 kv heads of 64, 32 experts of FFN 2880, 4 used, sliding window 128 on every other
    layer, YaRN 32 from 4096) in 8 layers rather than 24, vocabulary 32768 rather than 201088; MXFP4 experts,
    Q8_0 elsewhere (llama.cpp's MXFP4_MOE). About 3.4 GB; blocks from a pool of quantized random blocks."""
    n_layer, dim, n_head, n_kv, hd, n_expert, n_used, ffn_exp = 8, 2880, 64, 8, 64, 32, 4, 2880
    rng = np.random.default_rng(11)
    pool: dict = {}
    w = gguf.GGUFWriter(str(path), "gpt-oss")
    _hparams(w, "gpt-oss", n_layer=n_layer, n_ctx=131072, dim=dim, ffn=ffn_exp, n_head=n_head, n_kv=n_kv, head_dim=hd,
             base=150000.0, eps=1e-5)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    w.add_expert_feed_forward_length(ffn_exp)
    w.add_sliding_window(128)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(32.0)
    w.add_rope_scaling_orig_ctx_len(4096)
    specials = ["<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>",
                "<|constrain|>"]
    vocab = _gpt2_vocab(w, specials, pre="gpt-4o", eos=5, template=None,
                        n_extra=32768 - len(specials) - 256 - len(GPT2_MERGES))
    q, f32 = _pooled_writers(w, rng, pool)
    q("token_embd.weight", (vocab, dim), T.Q8_0, 0.5 * np.sqrt(dim))
    for i in range(n_layer):
        p = f"blk.{i}."
        f32(p + "attn_norm.weight", 1 + 0.1 * rng.standard_normal(dim))
        q(p + "attn_q.weight", (n_head * hd, dim), T.Q8_0)
        q(p + "attn_k.weight", (n_kv * hd, dim), T.Q8_0)
        q(p + "attn_v.weight", (n_kv * hd, dim), T.Q8_0)
        f32(p + "attn_q.bias", 0.1 * rng.standard_normal(n_head * hd))
        f32(p + "attn_k.bias", 0.1 * rng.standard_normal(n_kv * hd))
        f32(p + "attn_v.bias", 0.1 * rng.standard_normal(n_kv * hd))
        q(p + "attn_output.weight", (dim, n_head * hd), T.Q8_0)
        f32(p + "attn_output.bias", 0.1 * rng.standard_normal(dim))
        f32(p + "attn_sinks.weight", rng.standard_normal(n_head))
        f32(p + "post_attention_norm.weight", 1 + 0.1 * rng.standard_normal(dim))
        f32(p + "ffn_gate_inp.weight", rng.standard_normal((n_expert, dim)) * (3 / np.sqrt(dim)))
        f32(p + "ffn_gate_inp.bias", 0.5 * rng.standard_normal(n_expert))
        q(p + "ffn_gate_exps.weight", (n_expert, ffn_exp, dim), T.MXFP4)
        q(p + "ffn_up_exps.weight", (n_expert, ffn_exp, dim), T.MXFP4)
        q(p + "ffn_down_exps.weight", (n_expert, dim, ffn_exp), T.MXFP4)
        f32(p + "ffn_gate_exps.bias", 0.2 * rng.standard_normal((n_expert, ffn_exp)))
        f32(p + "ffn_up_exps.bias", 0.2 * rng.standard_normal((n_expert, ffn_exp)))
        f32(p + "ffn_down_exps.bias", 0.1 * rng.standard_normal((n_expert, dim)))
    f32("output_norm.weight", 1 + 0.1 * rng.standard_normal(dim))
    q("output.weight", (vocab, dim), T.Q8_0, 4)
    _finish(w)


def write_nemotron_h(path) -> None:
    """nemotron_h (Nemotron-H / Nemotron Nano 2's layer kinds): 5 layers "M-*M-", each one block after an
    RMS norm: layers 0 and 3 Mamba2 mixers (d_inner 512 in 8 heads of 64, d_state 32 in 2 groups, 4 taps),
    layer 2 attention without RoPE (4 heads / 2 kv heads of 64), layers 1 and 4 a feed-forward block alone
    (up 512, ReLU squared, down; no gate); head_count_kv and feed_forward_length per layer (both 0: Mamba2).
    The last layer is a feed-forward one. Untied output; Q4_K_M-like, SSM tensors F32."""
    n_layer, dim, n_head, n_kv, hd, ffn = 5, 256, 4, 2, 64, 512
    inner, n_state, heads, groups, taps = 512, 32, 8, 2, 4
    kinds = "M-*M-"
    r = _Init(15)
    w = gguf.GGUFWriter(str(path), "nemotron_h")
    _hparams(w, "nemotron_h", n_layer=n_layer, n_ctx=4096, dim=dim, ffn=[ffn if k == "-" else 0 for k in kinds],
             n_head=n_head, n_kv=[n_kv if k == "*" else 0 for k in kinds], head_dim=hd, eps=1e-5)
    w.add_layer_norm_eps(1e-5)  # the converter writes both; llama.cpp requires this one
    w.add_ssm_conv_kernel(taps)
    w.add_ssm_inner_size(inner)
    w.add_ssm_state_size(n_state)
    w.add_ssm_time_step_rank(heads)
    w.add_ssm_group_count(groups)
    vocab = _gpt2_vocab(w, ["<unk>", "<s>", "</s>", "<SPECIAL_10>", "<SPECIAL_11>"], bos=1, eos=2)
    _add(w, "token_embd.weight", r.embd(vocab, dim, 0.5), T.Q6_K)
    for i, kind in enumerate(kinds):
        p = f"blk.{i}."
        _add(w, p + "attn_norm.weight", r.norm(dim))
        if kind == "M":
            _mamba2_layer(w, r, p, i, n_layer, dim, inner, n_state, heads, groups, taps)
        elif kind == "*":
            _attention(w, r, p, dim, n_head, n_kv, hd, T.Q4_K, vtype=_q4km("attn_v", i, n_layer), o_mult=1.5)
        else:
            _add(w, p + "ffn_up.weight", r.mat(ffn, dim, 1.2), T.Q4_K)
            _add(w, p + "ffn_down.weight", r.mat(dim, ffn, 1.2), _q4km("ffn_down", i, n_layer))
    _add(w, "output_norm.weight", r.norm(dim))
    _add(w, "output.weight", r.mat(vocab, dim, 2.0), T.Q6_K)
    _finish(w)


def _qwen35_hparams(w: gguf.GGUFWriter, arch: str, n_layer: int, dim: int, ffn: int, heads: tuple, dk: int,
                    kheads: int, vheads: int, taps: int, rope_dim: int, sections: list, base: float = 1e7) -> None:
    # what convert_hf_to_gguf writes for Qwen3.5 (full_attention_interval, not recurrent_layers)
    n_head, n_kv, hd = heads
    _hparams(w, arch, n_layer=n_layer, n_ctx=4096, dim=dim, ffn=ffn, n_head=n_head, n_kv=n_kv, head_dim=hd,
             rope_dim=rope_dim, base=base)
    w.add_rope_dimension_sections(sections)
    w.add_ssm_conv_kernel(taps)
    w.add_ssm_state_size(dk)
    w.add_ssm_group_count(kheads)
    w.add_ssm_time_step_rank(vheads)
    w.add_ssm_inner_size(dk * vheads)
    w.add_full_attention_interval(4)


def _qwen35_layer_mixer(w, r: "_Init", p: str, i: int, n_layer: int, dim: int, heads: tuple, dk: int, kheads: int,
                        vheads: int, taps: int, qk: float = 0.65, ba: bool = False) -> None:
    """A qwen35 layer's mixer tensors: gated full attention on every fourth layer (attn_q twice as wide: each
    head's query then its gate), else a gated delta net (ba: beta and alpha in one ssm_ba, Qwen3-Next's);
    Q4_K_M-like, the taps, A, dt bias and norms F32."""
    n_head, n_kv, hd = heads
    if (i + 1) % 4 == 0:
        _add(w, p + "attn_q.weight", r.mat(2 * n_head * hd, dim), T.Q4_K)
        _add(w, p + "attn_k.weight", r.mat(n_kv * hd, dim), T.Q4_K)
        _add(w, p + "attn_v.weight", r.mat(n_kv * hd, dim), _q4km("attn_v", i, n_layer))
        _add(w, p + "attn_q_norm.weight", qk * r.norm(hd))
        _add(w, p + "attn_k_norm.weight", qk * r.norm(hd))
        _add(w, p + "attn_output.weight", r.mat(dim, n_head * hd, 1.5), T.Q4_K)
        return
    conv = 2 * kheads * dk + vheads * dk
    _add(w, p + "attn_qkv.weight", r.mat(conv, dim, 1.5), T.Q4_K)
    _add(w, p + "attn_gate.weight", r.mat(vheads * dk, dim), T.Q4_K)
    _add(w, p + "ssm_conv1d.weight", r.mat(conv, taps, 1.0))
    _add(w, p + "ssm_dt.bias", r.vec(vheads, 0.5))
    _add(w, p + "ssm_a", -np.exp(r.vec(vheads, 0.5)))
    if ba:
        _add(w, p + "ssm_ba.weight", r.mat(2 * vheads, dim), T.Q4_K)
    else:
        _add(w, p + "ssm_beta.weight", r.mat(vheads, dim), T.Q4_K)
        _add(w, p + "ssm_alpha.weight", r.mat(vheads, dim), T.Q4_K)
    _add(w, p + "ssm_norm.weight", r.norm(dk))
    _add(w, p + "ssm_out.weight", r.mat(dim, vheads * dk, 1.5), T.Q4_K)


def _shared_expert(w, r: "_Init", p: str, i: int, n_layer: int, dim: int, ffn_sh: int, gated: bool) -> None:
    """A layer's shared expert: its sigmoid gate vector where `gated` (qwen35moe, qwen3next; not granitehybrid),
    Q4_K gate and up, the down projection x1.5 as ffn_down on llama.cpp's use_more_bits layers."""
    if gated:
        _add(w, p + "ffn_gate_inp_shexp.weight", r.vec(dim, 1 / np.sqrt(dim)))
    _add(w, p + "ffn_gate_shexp.weight", r.mat(ffn_sh, dim), T.Q4_K)
    _add(w, p + "ffn_up_shexp.weight", r.mat(ffn_sh, dim), T.Q4_K)
    _add(w, p + "ffn_down_shexp.weight", r.mat(dim, ffn_sh, 1.5), _q4km("ffn_down", i, n_layer))


def write_qwen35(path) -> None:
    """qwen35 (Qwen3.5 dense): 4 layers, dim 256; layers 0-2 gated delta nets (2 key heads and 4 value heads
    of 64, 4 taps: a state of 3 inputs of 512 channels and four (64, 64) matrices per sequence), layer 3
    gated full attention (full_attention_interval 4: 4 heads / 2 kv heads of 64, per-head q/k norms, RoPE
    on all 64 dimensions, base 10000, IMRoPE sections [1, 1, 1, 29]: pairs 3-31, the fourth section's, stay
    unrotated for text; qwen35moe has Qwen3.5's partial rotation); post_attention_norm before a SiLU-gated FFN 512; tied embedding. The last layer is
    attention; llama.cpp's chunked delta net is checked by the 100-token prompt (chunk 64)."""
    n_layer, dim, ffn, heads, dk, kheads, vheads, taps = 4, 256, 512, (4, 2, 64), 64, 2, 4, 4
    r = _Init(16)
    w = gguf.GGUFWriter(str(path), "qwen35")
    _qwen35_hparams(w, "qwen35", n_layer, dim, ffn, heads, dk, kheads, vheads, taps, 64, [1, 1, 1, 29], base=1e4)
    vocab = _gpt2_vocab(w, ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"], pre="qwen35",
                        eos=2, template=QWEN3_TEMPLATE)
    _add(w, "token_embd.weight", r.embd(vocab, dim, 0.12), T.Q6_K)
    for i in range(n_layer):
        p = f"blk.{i}."
        _add(w, p + "attn_norm.weight", r.norm(dim))
        # q/k norm weights 1.3: attention sharp enough that its positions show in the logits
        _qwen35_layer_mixer(w, r, p, i, n_layer, dim, heads, dk, kheads, vheads, taps, qk=1.3)
        _add(w, p + "post_attention_norm.weight", r.norm(dim))
        _add(w, p + "ffn_gate.weight", r.mat(ffn, dim), T.Q4_K)
        _add(w, p + "ffn_up.weight", r.mat(ffn, dim), T.Q4_K)
        _add(w, p + "ffn_down.weight", r.mat(dim, ffn, 1.5), _q4km("ffn_down", i, n_layer))
    _add(w, "output_norm.weight", 1.6 * r.norm(dim))
    _finish(w)


def write_qwen35moe(path) -> None:
    """qwen35moe (Qwen3.5/3.6 MoE): write_qwen35's layers (5 of them: the delta nets with 2 key heads and 4
    value heads, layer 3 attention) with a mixture of experts in every layer: 8 experts, 2 used, expert
    FFN 256 (expert_feed_forward_length), softmax routing renormalised, and a shared expert (FFN 256) gated
    by sigmoid(h . ffn_gate_inp_shexp), the experts' down projections at x0.6 (a choice flipped by rounding
    stays within the tolerance); IMRoPE sections [3, 3, 2, 0]; untied output."""
    n_layer, dim, heads, dk, kheads, vheads, taps = 5, 256, (4, 2, 64), 64, 2, 4, 4
    n_expert, n_used, ffn_exp, ffn_sh = 8, 2, 256, 256
    r = _Init(17)
    w = gguf.GGUFWriter(str(path), "qwen35moe")
    _qwen35_hparams(w, "qwen35moe", n_layer, dim, 768, heads, dk, kheads, vheads, taps, 16, [3, 3, 2, 0])
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    w.add_expert_feed_forward_length(ffn_exp)
    w.add_expert_shared_feed_forward_length(ffn_sh)
    vocab = _gpt2_vocab(w, ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"], pre="qwen35",
                        eos=2, template=QWEN3_TEMPLATE)
    _add(w, "token_embd.weight", r.embd(vocab, dim, 0.5), T.Q4_K)
    for i in range(n_layer):
        p = f"blk.{i}."
        _add(w, p + "attn_norm.weight", r.norm(dim))
        _qwen35_layer_mixer(w, r, p, i, n_layer, dim, heads, dk, kheads, vheads, taps)
        _add(w, p + "post_attention_norm.weight", r.norm(dim))
        _moe_layer(w, r, p, i, n_layer, dim, n_expert, ffn_exp,
                   {"gate": T.Q4_K, "up": T.Q4_K, "down": lambda i, n: _q4km("ffn_down_exps", i, n)}, router=5,
                   down=0.6)
        _shared_expert(w, r, p, i, n_layer, dim, ffn_sh, gated=True)
    _add(w, "output_norm.weight", r.norm(dim))
    _add(w, "output.weight", r.mat(vocab, dim, 3.0), T.Q6_K)
    _finish(w)


def write_qwen3next(path) -> None:
    """qwen3next (Qwen3-Next-80B-A3B's layer kinds): 4 layers, dim 256, layers 0-2 gated delta nets (2 key
    heads and 4 value heads of 64: value head h reads key head h // 2, Qwen3-Next's repeat-interleave; beta
    and alpha in one ssm_ba grouped by key head; attn_qkv and attn_gate as the current converter writes
    them), layer 3 gated full attention with plain NeoX RoPE on 16 of 64 dimensions; experts in every layer
    (8, 2 used, FFN 256) with a gated shared expert (256); untied output."""
    n_layer, dim, (n_head, n_kv, hd), dk, kheads, vheads, taps = 4, 256, (4, 2, 64), 64, 2, 4, 4
    n_expert, n_used, ffn_exp, ffn_sh = 8, 2, 256, 256
    r = _Init(23)  # a seed where no token's expert choice is within rounding of a tie
    w = gguf.GGUFWriter(str(path), "qwen3next")
    _hparams(w, "qwen3next", n_layer=n_layer, n_ctx=4096, dim=dim, ffn=768, n_head=n_head, n_kv=n_kv, head_dim=hd,
             rope_dim=16, base=1e4)
    w.add_ssm_conv_kernel(taps)
    w.add_ssm_state_size(dk)
    w.add_ssm_group_count(kheads)
    w.add_ssm_time_step_rank(vheads)
    w.add_ssm_inner_size(dk * vheads)
    w.add_full_attention_interval(4)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    w.add_expert_feed_forward_length(ffn_exp)
    w.add_expert_shared_feed_forward_length(ffn_sh)
    vocab = _gpt2_vocab(w, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], pre="qwen2", eos=2)
    _add(w, "token_embd.weight", r.embd(vocab, dim, 0.5), T.Q4_K)
    for i in range(n_layer):
        p = f"blk.{i}."
        _add(w, p + "attn_norm.weight", r.norm(dim))
        _qwen35_layer_mixer(w, r, p, i, n_layer, dim, (n_head, n_kv, hd), dk, kheads, vheads, taps, ba=True)
        _add(w, p + "post_attention_norm.weight", r.norm(dim))
        _moe_layer(w, r, p, i, n_layer, dim, n_expert, ffn_exp,
                   {"gate": T.Q4_K, "up": T.Q4_K, "down": lambda i, n: _q4km("ffn_down_exps", i, n)}, router=5)
        _shared_expert(w, r, p, i, n_layer, dim, ffn_sh, gated=True)
    _add(w, "output_norm.weight", r.norm(dim))
    _add(w, "output.weight", r.mat(vocab, dim, 3.0), T.Q6_K)
    _finish(w)


def write_falcon_h1(path) -> None:
    """falcon-h1 (Falcon-H1's layer): 3 layers, dim 256, each with attention (4 heads / 2 kv heads of 64, NeoX
    RoPE) and a Mamba2 mixer (d_inner 512 in 8 heads of 64, d_state 32 in 2 groups, 4 taps) side by side on
    the same normed input, summed into the residual, then a SiLU-gated FFN 512 (its norm blk.N.ffn_norm, no
    suffix, as the converter writes Falcon-H1's); the Mamba2 group
    norm in layers 0 and 2 only (Falcon-H1 files may have none: silu(z) y alone). Untied output."""
    n_layer, dim, n_head, n_kv, hd, ffn = 3, 256, 4, 2, 64, 512
    inner, n_state, heads, groups, taps = 512, 32, 8, 2, 4
    r = _Init(27)
    w = gguf.GGUFWriter(str(path), "falcon-h1")
    _hparams(w, "falcon-h1", n_layer=n_layer, n_ctx=4096, dim=dim, ffn=ffn, n_head=n_head, n_kv=n_kv, head_dim=hd,
             eps=1e-5)
    w.add_ssm_conv_kernel(taps)
    w.add_ssm_inner_size(inner)
    w.add_ssm_state_size(n_state)
    w.add_ssm_time_step_rank(heads)
    w.add_ssm_group_count(groups)
    vocab = _gpt2_vocab(w, ["<|pad|>", "<|begin_of_text|>", "<|end_of_text|>"], pre="falcon-h1", bos=1, eos=2)
    _add(w, "token_embd.weight", r.embd(vocab, dim, 0.5), T.Q6_K)
    for i in range(n_layer):
        p = f"blk.{i}."
        _add(w, p + "attn_norm.weight", r.norm(dim))
        _attention(w, r, p, dim, n_head, n_kv, hd, T.Q4_K, vtype=_q4km("attn_v", i, n_layer))
        _mamba2_layer(w, r, p, i, n_layer, dim, inner, n_state, heads, groups, taps, norm=i != 1)
        _add(w, p + "ffn_norm", r.norm(dim))  # no suffix: the converter's FFN_PRE_NORM mapping
        _add(w, p + "ffn_gate.weight", r.mat(ffn, dim), T.Q4_K)
        _add(w, p + "ffn_up.weight", r.mat(ffn, dim), T.Q4_K)
        _add(w, p + "ffn_down.weight", r.mat(dim, ffn, 1.5), _q4km("ffn_down", i, n_layer))
    _add(w, "output_norm.weight", r.norm(dim))
    _add(w, "output.weight", r.mat(vocab, dim, 2.0), T.Q6_K)
    _finish(w)


def write_lfm2_bench(path) -> None:
    """A realistic-shape random lfm2 for benchmarks only (not in the golden file): LFM2-1.2B's shape, 16
    layers, dim 2048, 10 gated short convolutions (3 taps) and 6 attention layers (2, 5, 8, 10, 12, 14: 32
    heads / 8 kv heads of 64), FFN 8192, vocabulary 65536, tied embedding; Q4_K_M-like (Q6_K attn_v and
    ffn_down on llama.cpp's use_more_bits layers, Q6_K token_embd). About 0.7 GB, from pooled blocks."""
    n_layer, dim, n_head, n_kv, hd, ffn, taps = 16, 2048, 32, 8, 64, 8192, 3
    attn = {2, 5, 8, 10, 12, 14}
    rng = np.random.default_rng(12)
    pool: dict = {}
    w = gguf.GGUFWriter(str(path), "lfm2")
    _hparams(w, "lfm2", n_layer=n_layer, n_ctx=4096, dim=dim, ffn=ffn, n_head=n_head,
             n_kv=[n_kv if i in attn else 0 for i in range(n_layer)], base=1e6, eps=1e-5)
    w.add_shortconv_l_cache(taps)
    specials = ["<|pad|>", "<|startoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = _gpt2_vocab(w, specials, pre="lfm2", bos=1, eos=3, add_bos=True,
                        n_extra=65536 - len(specials) - 256 - len(GPT2_MERGES))

    q, f32 = _pooled_writers(w, rng, pool)

    q("token_embd.weight", (vocab, dim), T.Q6_K, 0.5 * np.sqrt(dim))
    n_v = 0
    for i in range(n_layer):
        p = f"blk.{i}."
        f32(p + "attn_norm.weight", 1 + 0.1 * rng.standard_normal(dim))
        if i in attn:
            q(p + "attn_q.weight", (n_head * hd, dim), T.Q4_K, 2)
            q(p + "attn_k.weight", (n_kv * hd, dim), T.Q4_K, 2)
            q(p + "attn_v.weight", (n_kv * hd, dim), _q4km("attn_v", n_v, len(attn)))
            f32(p + "attn_q_norm.weight", 1 + 0.1 * rng.standard_normal(hd))
            f32(p + "attn_k_norm.weight", 1 + 0.1 * rng.standard_normal(hd))
            q(p + "attn_output.weight", (dim, n_head * hd), T.Q4_K)
            n_v += 1
        else:
            q(p + "shortconv.in_proj.weight", (3 * dim, dim), T.Q4_K, 1.5)
            f32(p + "shortconv.conv.weight", rng.standard_normal((dim, taps)) * 0.5)
            q(p + "shortconv.out_proj.weight", (dim, dim), T.Q4_K)
        f32(p + "ffn_norm.weight", 1 + 0.1 * rng.standard_normal(dim))
        q(p + "ffn_gate.weight", (ffn, dim), T.Q4_K)
        q(p + "ffn_up.weight", (ffn, dim), T.Q4_K)
        q(p + "ffn_down.weight", (dim, ffn), _q4km("ffn_down", i, n_layer))
    f32("token_embd_norm.weight", 1 + 0.1 * rng.standard_normal(dim))
    _finish(w)


def write_mamba2_bench(path) -> None:
    """A realistic-shape random mamba2 for benchmarks only: Mamba2-370M's shape, 48 layers, dim 1024,
    d_inner 2048 in 32 heads of 64, d_state 128, 1 group, 4 taps, vocabulary 50288, untied output; Q4_K
    in/out projections (as llama-quantize gives them: neither is ffn_down), Q6_K embedding and output. About
    0.3 GB."""
    n_layer, dim, inner, n_state, heads, groups, taps = 48, 1024, 2048, 128, 32, 1, 4
    conv = inner + 2 * groups * n_state
    rng = np.random.default_rng(13)
    pool: dict = {}
    w = gguf.GGUFWriter(str(path), "mamba2")
    _mamba2_hparams(w, n_layer, dim, inner, n_state, heads, groups, taps)
    vocab = _gpt2_vocab(w, ["<|endoftext|>", "<|padding|>"], eos=0, template=None,
                        n_extra=50288 - 2 - 256 - len(GPT2_MERGES))

    q, f32 = _pooled_writers(w, rng, pool)

    q("token_embd.weight", (vocab, dim), T.Q6_K, 0.5 * np.sqrt(dim))
    for i in range(n_layer):
        p = f"blk.{i}."
        f32(p + "attn_norm.weight", 1 + 0.1 * rng.standard_normal(dim))
        q(p + "ssm_in.weight", (inner + conv + heads, dim), T.Q4_K, 1.5)
        f32(p + "ssm_conv1d.weight", rng.standard_normal((conv, taps)) * 0.5)
        f32(p + "ssm_conv1d.bias", 0.1 * rng.standard_normal(conv))
        f32(p + "ssm_dt.bias", 0.5 * rng.standard_normal(heads) - 1.0)
        f32(p + "ssm_a", -np.exp(0.5 * rng.standard_normal((heads, 1))))
        f32(p + "ssm_d", 1 + 0.1 * rng.standard_normal((heads, 1)))
        f32(p + "ssm_norm.weight", 1 + 0.1 * rng.standard_normal((groups, inner // groups)))
        q(p + "ssm_out.weight", (dim, inner), T.Q4_K, 1.5)
    f32("output_norm.weight", 1 + 0.1 * rng.standard_normal(dim))
    q("output.weight", (vocab, dim), T.Q6_K, 2)
    _finish(w)


def write_qwen35_bench(path) -> None:
    """A realistic-shape random qwen35 for benchmarks only: a 2B-class Qwen3.5 shape, 24 layers (18 gated
    delta nets of 16 key and 16 value heads of 128, 4 taps; every fourth layer gated attention of 8 heads / 2
    kv heads of 256, 64 rotary dimensions, IMRoPE sections [11, 11, 10, 0]), dim 2048, FFN 6144, vocabulary
    151936, tied embedding; Q4_K_M-like (Q6_K attn_v / ffn_down on llama.cpp's use_more_bits layers, Q6_K
    token_embd). About 1.2 GB, from pooled blocks."""
    n_layer, dim, ffn, (n_head, n_kv, hd), dk, kheads, vheads, taps = 24, 2048, 6144, (8, 2, 256), 128, 16, 16, 4
    rng = np.random.default_rng(14)
    pool: dict = {}
    w = gguf.GGUFWriter(str(path), "qwen35")
    _qwen35_hparams(w, "qwen35", n_layer, dim, ffn, (n_head, n_kv, hd), dk, kheads, vheads, taps, 64, [11, 11, 10, 0])
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    vocab = _gpt2_vocab(w, specials, pre="qwen35", eos=2, template=QWEN3_TEMPLATE,
                        n_extra=151936 - len(specials) - 256 - len(GPT2_MERGES))
    q, f32 = _pooled_writers(w, rng, pool)
    q("token_embd.weight", (vocab, dim), T.Q6_K, 0.5 * np.sqrt(dim))
    conv = 2 * kheads * dk + vheads * dk
    n_attn = 0
    for i in range(n_layer):
        p = f"blk.{i}."
        f32(p + "attn_norm.weight", 1 + 0.1 * rng.standard_normal(dim))
        if (i + 1) % 4 == 0:
            q(p + "attn_q.weight", (2 * n_head * hd, dim), T.Q4_K)
            q(p + "attn_k.weight", (n_kv * hd, dim), T.Q4_K)
            q(p + "attn_v.weight", (n_kv * hd, dim), _q4km("attn_v", n_attn, n_layer // 4))
            f32(p + "attn_q_norm.weight", 1 + 0.1 * rng.standard_normal(hd))
            f32(p + "attn_k_norm.weight", 1 + 0.1 * rng.standard_normal(hd))
            q(p + "attn_output.weight", (dim, n_head * hd), T.Q4_K)
            n_attn += 1
        else:
            q(p + "attn_qkv.weight", (conv, dim), T.Q4_K, 1.5)
            q(p + "attn_gate.weight", (vheads * dk, dim), T.Q4_K)
            f32(p + "ssm_conv1d.weight", rng.standard_normal((conv, taps)) * 0.5)
            f32(p + "ssm_dt.bias", 0.5 * rng.standard_normal(vheads))
            f32(p + "ssm_a", -np.exp(0.5 * rng.standard_normal(vheads)))
            q(p + "ssm_beta.weight", (vheads, dim), T.Q4_K)
            q(p + "ssm_alpha.weight", (vheads, dim), T.Q4_K)
            f32(p + "ssm_norm.weight", 1 + 0.1 * rng.standard_normal(dk))
            q(p + "ssm_out.weight", (dim, vheads * dk), T.Q4_K)
        f32(p + "post_attention_norm.weight", 1 + 0.1 * rng.standard_normal(dim))
        q(p + "ffn_gate.weight", (ffn, dim), T.Q4_K)
        q(p + "ffn_up.weight", (ffn, dim), T.Q4_K)
        q(p + "ffn_down.weight", (dim, ffn), _q4km("ffn_down", i, n_layer))
    f32("output_norm.weight", 1 + 0.1 * rng.standard_normal(dim))
    _finish(w)


def write_gemma4(path, experts: bool = False) -> None:
    """gemma4 (Gemma 4 dense): 6 layers, dim 256, 4 heads; layers 0, 1, 2, 4 sliding-window (window 8; head
    size 64 all rotated, RoPE base 10000, 2 KV heads), layers 3 and 5 full attention (head size 128, 1 KV
    head, base 1e6, "proportional" RoPE: rope_freqs 1 on the first 16 of 64 pairs and 1e30, no rotation, on the
    rest). attention.shared_kv_layers 2: layer 4 reads layer 2's KV and layer 5 layer 3's (llama.cpp's rule:
    the last sliding, the last full layer before them); layer 4 still has an attn_k (unused), layer 5 none.
    Layer 3 has no attn_v: V is K's projection. FFN 512 wide, 1024 in the shared layers (double-wide MLP,
    feed_forward_length per layer). Per-layer token inputs of 32 a layer (per_layer_token_embd Q8_0,
    per_layer_model_proj, each layer's inp_gate, proj and post_norm), layer_output_scale on every layer but 1.
    llama.cpp's gemma4: embeddings times sqrt(dim); q, k normed per head with weights, V RMS-normed without;
    scores not scaled (f_attention_scale 1), so the q and k norms' weights are ~0.35 (scores of std ~1, not a
    chaotic model); post norms; final logit softcap 30. Q4_K_M-like types."""
    n_layer, dim, n_head, ffn, e = 6, 256, 4, 512, 32
    sliding = [True, True, True, False, True, False]
    hd = {True: 64, False: 128}
    kv = {True: 2, False: 1}
    r = _Init(37 if experts else 31)
    w = gguf.GGUFWriter(str(path), "gemma4")
    n_exp, fe = 4, 256
    w.add_block_count(n_layer)
    w.add_context_length(512)
    w.add_embedding_length(dim)
    w.add_feed_forward_length([ffn] * 4 + [2 * ffn] * 2)
    w.add_head_count(n_head)
    w.add_head_count_kv([kv[s] for s in sliding])
    w.add_key_length(hd[False])
    w.add_value_length(hd[False])
    w.add_key_length_swa(hd[True])
    w.add_value_length_swa(hd[True])
    w.add_rope_dimension_count(hd[False])
    w.add_rope_dimension_count_swa(hd[True])
    w.add_rope_freq_base(1e6)
    w.add_rope_freq_base_swa(1e4)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_sliding_window(8)
    w.add_sliding_window_pattern(sliding)
    w.add_shared_kv_layers(2)
    w.add_embedding_length_per_layer_input(e)
    w.add_final_logit_softcapping(30.0)
    if experts:
        w.add_expert_count(n_exp)
        w.add_expert_used_count(4)
        w.add_expert_feed_forward_length(fe)
    vocab = _spm_vocab(w)
    _add(w, "token_embd.weight", r.embd(vocab, dim, 0.06), T.Q6_K)
    _add(w, "rope_freqs.weight", np.array([1.0] * 16 + [1e30] * 48, np.float32))
    _add(w, "per_layer_token_embd.weight", r.embd(vocab, n_layer * e, 0.5), T.Q8_0)
    _add(w, "per_layer_model_proj.weight", r.mat(n_layer * e, dim), T.Q4_K)
    _add(w, "per_layer_proj_norm.weight", r.norm(e))
    for i, sl in enumerate(sliding):
        p, d, f = f"blk.{i}.", hd[sl], ffn * (2 if i >= 4 else 1)
        _add(w, p + "attn_norm.weight", r.norm(dim))
        _add(w, p + "attn_q.weight", r.mat(n_head * d, dim), T.Q4_K)
        if i != 5:
            _add(w, p + "attn_k.weight", r.mat(kv[sl] * d, dim), T.Q4_K)
            _add(w, p + "attn_k_norm.weight", 0.35 * r.norm(d))
        if i not in (3, 5):
            _add(w, p + "attn_v.weight", r.mat(kv[sl] * d, dim), _q4km("attn_v", i, n_layer))
        _add(w, p + "attn_q_norm.weight", 0.35 * r.norm(d))
        _add(w, p + "attn_output.weight", r.mat(dim, n_head * d), T.Q4_K)
        _add(w, p + "post_attention_norm.weight", 2 * r.norm(dim))
        _add(w, p + "ffn_norm.weight", r.norm(dim))
        _add(w, p + "ffn_gate.weight", r.mat(f, dim, 2), T.Q4_K)
        _add(w, p + "ffn_up.weight", r.mat(f, dim), T.Q4_K)
        _add(w, p + "ffn_down.weight", r.mat(dim, f), _q4km("ffn_down", i, n_layer))
        if experts:  # the experts beside the dense FFN, gate and up fused in layers 0-2 and apart in 3-5
            _add(w, p + "post_ffw_norm_1.weight", r.norm(dim))
            _add(w, p + "pre_ffw_norm_2.weight", r.norm(dim))
            _add(w, p + "post_ffw_norm_2.weight", r.norm(dim))
            _add(w, p + "ffn_gate_inp.weight", r.mat(n_exp, dim, 8))
            _add(w, p + "ffn_gate_inp.scale", r.norm(dim))
            if i < 3:
                _add(w, p + "ffn_gate_up_exps.weight", r.exps(n_exp, 2 * fe, dim) * np.repeat([2.0, 1.0], fe)[:, None],
                     T.Q4_K)
            else:
                _add(w, p + "ffn_gate_exps.weight", r.exps(n_exp, fe, dim, 2), T.Q4_K)
                _add(w, p + "ffn_up_exps.weight", r.exps(n_exp, fe, dim), T.Q4_K)
            _add(w, p + "ffn_down_exps.weight", r.exps(n_exp, dim, fe), T.Q4_K)
            _add(w, p + "ffn_down_exps.scale", 0.5 + r.rng.random(n_exp))
        _add(w, p + "post_ffw_norm.weight", 2 * r.norm(dim))
        _add(w, p + "inp_gate.weight", r.mat(e, dim, 2), T.Q4_K)
        _add(w, p + "proj.weight", r.mat(dim, e), T.Q8_0)
        _add(w, p + "post_norm.weight", r.norm(dim))
        if i != 1:
            _add(w, p + "layer_output_scale.weight", np.array([0.6 + 0.1 * i], np.float32))
    _add(w, "output_norm.weight", 2.5 * r.norm(dim))
    _finish(w)


def write_gemma4moe(path) -> None:
    """gemma4 with experts (Gemma 4 26B-A4B style): write_gemma4's model (its own draws) with, in every layer,
    4 experts (256 wide) beside the dense FFN, all 4 used by every token (with 2 of 4 the choice of the second
    flips between two correct engines' roundings on near-ties, and a model that small then differs wholesale:
    the top-k itself is the routers' shared code, checked on the other MoE zoo models); post_ffw_norm_1 on the dense FFN's output,
    pre_ffw_norm_2 on the experts' input, post_ffw_norm_2 on their weighted sum; the router (F32, x8) on the
    layer's input RMS-normed without weights, times 1/sqrt(dim) and ffn_gate_inp.scale; ffn_down_exps.scale
    on each expert's output; layers 0-2 with gate and up fused (ffn_gate_up_exps), 3-5 apart."""
    write_gemma4(path, experts=True)


def write_gemma3n(path) -> None:
    """gemma3n (Gemma 3n): 22 layers, dim 256, 4 heads / 2 kv heads of 64, ffn 512, every fifth layer global
    (attention.sliding_window_pattern; layer 21 made global too, window 8), RoPE bases 1e6 and 1e4 (sliding).
    The sizes llama.cpp fixes for it rather than reading them: 4 AltUp streams (the first active), LAuReL of rank
    64, per-layer inputs of 256, KV of its own in the first 20 layers (the last 2 read layers 18 and 19's:
    attention.shared_kv_layers 2 says so too), activation sparsity (mean + 1.645 std) in the first 10 FFNs.
    AltUp's and LAuReL's matrices and the per-layer projection F16 (llama-quantize keeps them), the router and
    coefficients F32, the rest
    Q4_K_M-like; q and k norms ~0.35 (unscaled scores, as gemma4) and the post-norms ~0.3 (22 layers on
    four streams: larger blocks make a chaotic model)."""
    n_layer, dim, n_head, n_kv, hd, ffn, e, n_alt, rank = 22, 256, 4, 2, 64, 512, 256, 4, 64
    sliding = [i % 5 != 4 for i in range(n_layer)]
    sliding[21] = False
    r = _Init(41)
    w = gguf.GGUFWriter(str(path), "gemma3n")
    _hparams(w, "gemma3n", n_layer=n_layer, n_ctx=512, dim=dim, ffn=ffn, n_head=n_head, n_kv=n_kv, head_dim=hd,
             base=1e6)
    w.add_rope_freq_base_swa(1e4)
    w.add_sliding_window(8)
    w.add_sliding_window_pattern(sliding)
    w.add_shared_kv_layers(2)
    w.add_embedding_length_per_layer_input(e)
    w.add_altup_active_idx(0)
    w.add_altup_num_inputs(n_alt)
    w.add_final_logit_softcapping(30.0)
    vocab = _spm_vocab(w)
    _add(w, "token_embd.weight", r.embd(vocab, dim, 0.06), T.Q6_K)
    _add(w, "per_layer_token_embd.weight", r.embd(vocab, n_layer * e, 0.5), T.Q8_0)
    _add(w, "per_layer_model_proj.weight", r.mat(n_layer * e, dim), T.F16)
    _add(w, "per_layer_proj_norm.weight", r.norm(e))
    _add(w, "altup_proj.weight", r.exps(n_alt - 1, dim, dim), T.F16)
    _add(w, "altup_unembd_proj.weight", r.exps(n_alt - 1, dim, dim), T.F16)
    for i in range(n_layer):
        p = f"blk.{i}."
        _add(w, p + "attn_norm.weight", r.norm(dim))
        _add(w, p + "attn_q.weight", r.mat(n_head * hd, dim), T.Q4_K)
        _add(w, p + "attn_k.weight", r.mat(n_kv * hd, dim), T.Q4_K)
        _add(w, p + "attn_v.weight", r.mat(n_kv * hd, dim), _q4km("attn_v", i, n_layer))
        _add(w, p + "attn_q_norm.weight", 0.35 * r.norm(hd))
        _add(w, p + "attn_k_norm.weight", 0.35 * r.norm(hd))
        _add(w, p + "attn_output.weight", r.mat(dim, n_head * hd), T.Q4_K)
        _add(w, p + "post_attention_norm.weight", 0.3 * r.norm(dim))
        _add(w, p + "ffn_norm.weight", r.norm(dim))
        _add(w, p + "ffn_gate.weight", r.mat(ffn, dim, 2), T.Q4_K)
        _add(w, p + "ffn_up.weight", r.mat(ffn, dim), T.Q4_K)
        _add(w, p + "ffn_down.weight", r.mat(dim, ffn), _q4km("ffn_down", i, n_layer))
        _add(w, p + "post_ffw_norm.weight", 0.3 * r.norm(dim))
        _add(w, p + "inp_gate.weight", r.mat(e, dim, 2), T.Q4_K)
        _add(w, p + "proj.weight", r.mat(dim, e), T.Q4_K)
        _add(w, p + "post_norm.weight", r.norm(dim))
        _add(w, p + "altup_correct_coef.weight", 0.3 * r.rng.standard_normal((n_alt, n_alt)))
        _add(w, p + "altup_correct_scale.weight", r.norm(dim))
        _add(w, p + "altup_predict_coef.weight", 0.3 * r.rng.standard_normal((n_alt * n_alt, n_alt)))
        _add(w, p + "altup_router.weight", r.mat(n_alt, dim, 16))
        _add(w, p + "altup_router_norm.weight", r.norm(dim))
        _add(w, p + "laurel_l.weight", r.mat(rank, dim), T.F16)
        _add(w, p + "laurel_r.weight", r.mat(dim, rank), T.F16)
        _add(w, p + "laurel_post_norm.weight", r.norm(dim))
    _add(w, "output_norm.weight", 2.5 * r.norm(dim))
    _finish(w)


def write_gemma4_bench(path) -> None:
    """A realistic-shape random gemma4 for benchmarks only: Gemma 4 E2B's shape, 35 layers of dim 1536, 8 heads
    over 1 KV head; sliding-window layers (window 512, four of every five) of heads of 256, full-attention ones of
    512 with their partial RoPE (rope_freqs: a quarter of the pairs rotated); the last 20 layers reading the KV of
    the last of each kind before them; FFN 6144, twice that in those shared layers; per-layer inputs of 256;
    vocabulary 262144, tied embedding (Q6_K), per_layer_token_embd Q8_0, per_layer_model_proj F16; Q4_K_M-like
    (Q6_K attn_v / ffn_down on llama.cpp's use_more_bits layers). About 3.8 GB, from pooled blocks."""
    n_layer, dim, ffn, n_head, n_kv, e, shared = 35, 1536, 6144, 8, 1, 256, 20
    hd = {True: 256, False: 512}
    sliding = [i % 5 != 4 for i in range(n_layer)]
    rng = np.random.default_rng(15)
    pool: dict = {}
    w = gguf.GGUFWriter(str(path), "gemma4")
    w.add_block_count(n_layer)
    w.add_context_length(32768)
    w.add_embedding_length(dim)
    w.add_feed_forward_length([ffn if i < n_layer - shared else 2 * ffn for i in range(n_layer)])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(hd[False])
    w.add_value_length(hd[False])
    w.add_key_length_swa(hd[True])
    w.add_value_length_swa(hd[True])
    w.add_rope_dimension_count(hd[False])
    w.add_rope_dimension_count_swa(hd[True])
    w.add_rope_freq_base(1e6)
    w.add_rope_freq_base_swa(1e4)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_sliding_window(512)
    w.add_sliding_window_pattern(sliding)
    w.add_shared_kv_layers(shared)
    w.add_embedding_length_per_layer_input(e)
    w.add_final_logit_softcapping(30.0)
    vocab = _gpt2_vocab(w, ["<pad>", "<eos>", "<bos>"], eos=1, n_extra=262144 - 3 - 256 - len(GPT2_MERGES),
                        template=GEMMA_TEMPLATE)
    q, f32 = _pooled_writers(w, rng, pool)
    q("token_embd.weight", (vocab, dim), T.Q6_K, 0.5 * np.sqrt(dim))
    f32("rope_freqs.weight", np.array([1.0] * 64 + [1e30] * 192))
    q("per_layer_token_embd.weight", (vocab, n_layer * e), T.Q8_0, 0.5 * np.sqrt(n_layer * e))
    w.add_tensor("per_layer_model_proj.weight",
                 (rng.standard_normal((n_layer * e, dim), np.float32) / np.sqrt(dim)).astype(np.float16))
    f32("per_layer_proj_norm.weight", 1 + 0.1 * rng.standard_normal(e))
    for i, sl in enumerate(sliding):
        p, d, f = f"blk.{i}.", hd[sl], ffn if i < n_layer - shared else 2 * ffn
        f32(p + "attn_norm.weight", 1 + 0.1 * rng.standard_normal(dim))
        q(p + "attn_q.weight", (n_head * d, dim), T.Q4_K)
        q(p + "attn_k.weight", (n_kv * d, dim), T.Q4_K)
        q(p + "attn_v.weight", (n_kv * d, dim), _q4km("attn_v", i, n_layer))
        f32(p + "attn_q_norm.weight", 0.35 * (1 + 0.1 * rng.standard_normal(d)))
        f32(p + "attn_k_norm.weight", 0.35 * (1 + 0.1 * rng.standard_normal(d)))
        q(p + "attn_output.weight", (dim, n_head * d), T.Q4_K)
        f32(p + "post_attention_norm.weight", 1 + 0.1 * rng.standard_normal(dim))
        f32(p + "ffn_norm.weight", 1 + 0.1 * rng.standard_normal(dim))
        q(p + "ffn_gate.weight", (f, dim), T.Q4_K)
        q(p + "ffn_up.weight", (f, dim), T.Q4_K)
        q(p + "ffn_down.weight", (dim, f), _q4km("ffn_down", i, n_layer))
        f32(p + "post_ffw_norm.weight", 1 + 0.1 * rng.standard_normal(dim))
        q(p + "inp_gate.weight", (e, dim), T.Q4_K)
        q(p + "proj.weight", (dim, e), T.Q8_0)
        f32(p + "post_norm.weight", 1 + 0.1 * rng.standard_normal(dim))
        f32(p + "layer_output_scale.weight", np.array([0.5 + 0.01 * i]))
    f32("output_norm.weight", 1 + 0.1 * rng.standard_normal(dim))
    _finish(w)


def write_gemma3n_bench(path) -> None:
    """A realistic-shape random gemma3n for benchmarks only: Gemma 3n E2B's shape, 30 layers of dim 2048, 8
    heads over 2 KV heads of 256, every fifth layer global (window 512), the last 10 on shared KV, FFN 8192,
    four AltUp streams, LAuReL rank 64, per-layer inputs of 256, vocabulary 262144 (tied, Q6_K;
    per_layer_token_embd Q8_0), AltUp, LAuReL and per_layer_model_proj F16, the rest Q4_K_M-like. About 3.5 GB."""
    n_layer, dim, ffn, n_head, n_kv, hd, e, n_alt, rank = 30, 2048, 8192, 8, 2, 256, 256, 4, 64
    rng = np.random.default_rng(16)
    pool: dict = {}
    w = gguf.GGUFWriter(str(path), "gemma3n")
    _hparams(w, "gemma3n", n_layer=n_layer, n_ctx=32768, dim=dim, ffn=ffn, n_head=n_head, n_kv=n_kv, head_dim=hd,
             base=1e6)
    w.add_rope_freq_base_swa(1e4)
    w.add_sliding_window(512)
    w.add_sliding_window_pattern([i % 5 != 4 for i in range(n_layer)])
    w.add_shared_kv_layers(10)
    w.add_embedding_length_per_layer_input(e)
    w.add_altup_active_idx(0)
    w.add_altup_num_inputs(n_alt)
    w.add_final_logit_softcapping(30.0)
    vocab = _gpt2_vocab(w, ["<pad>", "<eos>", "<bos>"], eos=1, n_extra=262144 - 3 - 256 - len(GPT2_MERGES),
                        template=GEMMA_TEMPLATE)
    q, f32 = _pooled_writers(w, rng, pool)
    f16 = lambda name, shape, s=1.0: w.add_tensor(  # noqa: E731
        name, (rng.standard_normal(shape, np.float32) * (s / np.sqrt(shape[-1]))).astype(np.float16))
    norm = lambda n, s=1.0: s * (1 + 0.1 * rng.standard_normal(n))  # noqa: E731
    q("token_embd.weight", (vocab, dim), T.Q6_K, 0.5 * np.sqrt(dim))
    q("per_layer_token_embd.weight", (vocab, n_layer * e), T.Q8_0, 0.5 * np.sqrt(n_layer * e))
    f16("per_layer_model_proj.weight", (n_layer * e, dim))
    f32("per_layer_proj_norm.weight", norm(e))
    f16("altup_proj.weight", (n_alt - 1, dim, dim))
    f16("altup_unembd_proj.weight", (n_alt - 1, dim, dim))
    for i in range(n_layer):
        p = f"blk.{i}."
        f32(p + "attn_norm.weight", norm(dim))
        q(p + "attn_q.weight", (n_head * hd, dim), T.Q4_K)
        q(p + "attn_k.weight", (n_kv * hd, dim), T.Q4_K)
        q(p + "attn_v.weight", (n_kv * hd, dim), _q4km("attn_v", i, n_layer))
        f32(p + "attn_q_norm.weight", norm(hd, 0.35))
        f32(p + "attn_k_norm.weight", norm(hd, 0.35))
        q(p + "attn_output.weight", (dim, n_head * hd), T.Q4_K)
        f32(p + "post_attention_norm.weight", norm(dim, 0.3))
        f32(p + "ffn_norm.weight", norm(dim))
        q(p + "ffn_gate.weight", (ffn, dim), T.Q4_K)
        q(p + "ffn_up.weight", (ffn, dim), T.Q4_K)
        q(p + "ffn_down.weight", (dim, ffn), _q4km("ffn_down", i, n_layer))
        f32(p + "post_ffw_norm.weight", norm(dim, 0.3))
        q(p + "inp_gate.weight", (e, dim), T.Q4_K)
        q(p + "proj.weight", (dim, e), T.Q4_K)
        f32(p + "post_norm.weight", norm(dim))
        f32(p + "altup_correct_coef.weight", 0.3 * rng.standard_normal((n_alt, n_alt)))
        f32(p + "altup_correct_scale.weight", norm(dim))
        f32(p + "altup_predict_coef.weight", 0.3 * rng.standard_normal((n_alt * n_alt, n_alt)))
        f32(p + "altup_router.weight", rng.standard_normal((n_alt, dim)) * (16 / np.sqrt(dim)))
        f32(p + "altup_router_norm.weight", norm(dim))
        f16(p + "laurel_l.weight", (rank, dim))
        f16(p + "laurel_r.weight", (dim, rank))
        f32(p + "laurel_post_norm.weight", norm(dim))
    f32("output_norm.weight", norm(dim))
    _finish(w)


ZOO = {
    "qwen3": write_qwen3,
    "llama3": write_llama3,
    "llama_swa": write_llama_swa,
    "phi3": write_phi3,
    "gemma2": write_gemma2,
    "olmo2": write_olmo2,
    "qwen3moe": write_qwen3moe,
    "olmoe": write_olmoe,
    "qwen2moe": write_qwen2moe,
    "qwen3moe_bench": write_qwen3moe_bench,
    "lfm2": write_lfm2,
    "lfm2moe": write_lfm2moe,
    "mamba2": write_mamba2,
    "granitehybrid": write_granitehybrid,
    "nemotron_h": write_nemotron_h,
    "qwen35": write_qwen35,
    "qwen35moe": write_qwen35moe,
    "qwen3next": write_qwen3next,
    "falcon-h1": write_falcon_h1,
    "smollm3": write_smollm3,
    "granite": write_granite,
    "granitemoe": write_granitemoe,
    "mistral3": write_mistral3,
    "gpt-oss": write_gpt_oss,
    "lfm2_bench": write_lfm2_bench,
    "mamba2_bench": write_mamba2_bench,
    "qwen35_bench": write_qwen35_bench,
    "gpt-oss_bench": write_gpt_oss_bench,
    "gemma4": write_gemma4,
    "gemma4moe": write_gemma4moe,
    "gemma3n": write_gemma3n,
    "gemma4_bench": write_gemma4_bench,
    "gemma3n_bench": write_gemma3n_bench,
}
GOLDEN = [n for n in ZOO if not n.endswith("_bench")]  # the models tests/golden/arch_zoo.json covers


def write(name: str, path) -> None:
    """Write zoo model `name` to `path`."""
    ZOO[name](path)


def copy_fields(r: gguf.GGUFReader, w: gguf.GGUFWriter, meta: dict | None = None, old_arch: str = "",
                arch: str = "") -> None:
    """Every metadata field of reader r into writer w but the header's and the architecture (w has its
    own): values replaced by meta ({key: value}, the type kept), keys of old_arch renamed to arch."""
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        new_key = key.replace(old_arch + ".", arch + ".", 1) if old_arch and arch else key
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            sub = f.types[1]
            val = [bytes(f.parts[i]).decode() if sub == gguf.GGUFValueType.STRING else f.parts[i].tolist()[0]
                   for i in f.data]
            w.add_key_value(new_key, val, vt, sub_type=sub)
            continue
        val = bytes(f.parts[f.data[0]]).decode() if vt == gguf.GGUFValueType.STRING else f.parts[f.data[0]].tolist()[0]
        w.add_key_value(new_key, (meta or {}).get(key, val), vt)


def write_f16(name: str, path, scratch) -> None:
    """Zoo model `name` as an F16 source for quantize-model: written to `scratch`, then every quantized
    tensor dequantized (gguf's numpy dequantize) to F16, F32 tensors and all metadata as they are."""
    write(name, scratch)
    r = gguf.GGUFReader(str(scratch))
    w = gguf.GGUFWriter(str(path), bytes(r.fields["general.architecture"].parts[-1]).decode())
    copy_fields(r, w)
    for t in r.tensors:
        if t.tensor_type == T.F32:
            w.add_tensor(t.name, np.array(t.data))
        else:
            w.add_tensor(t.name, gguf.dequantize(t.data, t.tensor_type).astype(np.float16))
    _finish(w)


def quantize_model_q4_k_m(name: str, tmp_path, mix: str = "Q4_K_M"):
    """quantize-model's Q4_K_M (or `mix`) of zoo model `name` in its F16 form (write_f16), in tmp_path: (its
    sha256, its path), to hold against llama-quantize's (the golden file's llama_quantize_<mix>_sha256)."""
    import hashlib
    import subprocess
    import sys

    src, dst = tmp_path / "f16.gguf", tmp_path / f"{mix.lower()}.gguf"
    write_f16(name, src, tmp_path / "scratch.gguf")
    r = subprocess.run([sys.executable, "-m", "edgeinfer.cli.main", "quantize-model", str(src), str(dst), "--type",
                        mix], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return hashlib.sha256(dst.read_bytes()).hexdigest(), dst
