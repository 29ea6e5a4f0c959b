"""Tiny random GGUF models written with gguf.GGUFWriter: no download needed."""

from __future__ import annotations

import gguf
import numpy as np
from gguf.constants import GGMLQuantizationType as T

from edgeinfer.tokenizer import bytes_to_unicode

try:  # the frozen K-quantizers the golden test models were written with
    import zoo_kquants
except ImportError:
    from . import zoo_kquants

GPT2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def quantize_rows(x: np.ndarray, qtype: T) -> np.ndarray:
    """x (any rank >= 2) quantized row by row: uint8 of shape (*x.shape[:-1], bytes per row)."""
    rows = x.reshape(-1, x.shape[-1]).astype(np.float32)
    k_quant = {T.Q4_K: zoo_kquants.quantize_q4_k, T.Q5_K: zoo_kquants.quantize_q5_k, T.Q6_K: zoo_kquants.quantize_q6_k}
    q = k_quant[qtype](rows) if qtype in k_quant else gguf.quants.quantize(rows, qtype)  # gguf has no K-quantizer
    return q.reshape(*x.shape[:-1], q.shape[-1])


def add_tensor(w: gguf.GGUFWriter, name: str, x: np.ndarray, qtype: T = T.F32) -> None:
    """x as a tensor of type qtype (vectors stay F32). numpy shape is GGUF's reversed: (rows, cols) for a
    matrix, (n_expert, rows, cols) for a layer's experts."""
    x = np.asarray(x, dtype=np.float32)
    if qtype == T.F32 or x.ndim == 1:
        w.add_tensor(name, x)
    elif qtype == T.F16:
        w.add_tensor(name, x.astype(np.float16))
    else:
        q = quantize_rows(x, qtype)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)


def finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_tiny_llama(path, *, qtype: T = T.Q8_0, n_layer: int = 2, dim: int = 64, n_head: int = 4,
                     n_kv: int | list = 2, ffn: int = 128, n_ctx: int = 256, seed: int = 0, tied: bool = True,
                     chat_template: str | None = CHATML_TEMPLATE, embd_type: T = T.Q8_0, arch: str = "llama",
                     extra_merges: tuple = (), bos_id: int = 1, eos_id: int = 2, extra_ids: dict | None = None,
                     extra_specials: tuple = ()) -> None:
    """A `llama` model with a GPT-2 byte-level BPE vocabulary of 256 bytes, a few merges and specials.
    arch "qwen2": the same with biases on q, k and v. extra_merges (added after the vocabulary is built),
    bos_id, eos_id and extra_ids ({"eot": id, ...}) make hostile vocabularies; extra_specials are control
    tokens added at the end of the vocabulary (FIM tokens, say)."""
    rng = np.random.default_rng(seed)
    b2u = bytes_to_unicode()
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s"]
    tokens = GPT2_SPECIALS + [b2u[b] for b in range(256)] + [m.replace(" ", "") for m in merges]
    ttype = [3] * len(GPT2_SPECIALS) + [1] * (len(tokens) - len(GPT2_SPECIALS))
    tokens += list(extra_specials)
    ttype += [3] * len(extra_specials)
    vocab = len(tokens)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(n_layer)
    w.add_context_length(n_ctx)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(dim // n_head)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(ttype)
    w.add_token_merges(merges + list(extra_merges))
    w.add_bos_token_id(bos_id)
    w.add_eos_token_id(eos_id)
    for name, tid in (extra_ids or {}).items():
        w.add_uint32(f"tokenizer.ggml.{name}_token_id", tid)
    w.add_add_bos_token(False)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    hd = dim // n_head
    s = 0.5
    if not isinstance(n_kv, int):  # per-layer head counts (a test of the error they give)
        n_kv = n_kv[0]
    add_tensor(w, "token_embd.weight", rng.standard_normal((vocab, dim)) * s, embd_type)
    for i in range(n_layer):
        p = f"blk.{i}."
        add_tensor(w, p + "attn_norm.weight", 1 + 0.1 * rng.standard_normal(dim), T.F32)
        add_tensor(w, p + "attn_q.weight", rng.standard_normal((n_head * hd, dim)) * s / np.sqrt(dim) * 4, qtype)
        add_tensor(w, p + "attn_k.weight", rng.standard_normal((n_kv * hd, dim)) * s / np.sqrt(dim) * 4, qtype)
        add_tensor(w, p + "attn_v.weight", rng.standard_normal((n_kv * hd, dim)) / np.sqrt(dim), qtype)
        if arch == "qwen2":  # biases big enough to matter (Qwen2.5's k biases run to tens)
            add_tensor(w, p + "attn_q.bias", rng.standard_normal(n_head * hd), T.F32)
            add_tensor(w, p + "attn_k.bias", 3 * rng.standard_normal(n_kv * hd), T.F32)
            add_tensor(w, p + "attn_v.bias", rng.standard_normal(n_kv * hd), T.F32)
        add_tensor(w, p + "attn_output.weight", rng.standard_normal((dim, n_head * hd)) / np.sqrt(dim), qtype)
        add_tensor(w, p + "ffn_norm.weight", 1 + 0.1 * rng.standard_normal(dim), T.F32)
        add_tensor(w, p + "ffn_gate.weight", rng.standard_normal((ffn, dim)) / np.sqrt(dim), qtype)
        add_tensor(w, p + "ffn_up.weight", rng.standard_normal((ffn, dim)) / np.sqrt(dim), qtype)
        add_tensor(w, p + "ffn_down.weight", rng.standard_normal((dim, ffn)) / np.sqrt(ffn), qtype)
    add_tensor(w, "output_norm.weight", 1 + 0.1 * rng.standard_normal(dim), T.F32)
    if not tied:
        add_tensor(w, "output.weight", rng.standard_normal((vocab, dim)) / np.sqrt(dim) * 4, qtype)
    finish(w)


QWEN_FIM_SPECIALS = ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>",
                     "<|file_sep|>")


def write_tiny_fim(path, **kw) -> None:
    """The tiny llama with Qwen2.5-Coder's six FIM tokens at the end of its vocabulary (ids 267..272)."""
    write_tiny_llama(path, extra_specials=QWEN_FIM_SPECIALS, **kw)


def spm_vocab() -> tuple[list[str], list[float], list[int]]:
    """A small SentencePiece vocabulary: controls, byte fallback pieces, and some words."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    types = [3, 3, 3, 2, 3, 3]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    words = ["▁", "▁the", "▁a", "e", "t", "h", "a", "▁t", "th", "he", "▁th", "in", "er", "▁▁", "\n", "o", "n", "s",
             "r", "i", "l", "d", "▁of", "▁and", "▁in", "on", "at", "en", "▁s", "▁w"]
    tokens += words
    types += [1] * len(words)
    tokens += ["<b>", "  "]  # user-defined pieces (Gemma has runs of raw spaces and HTML tags)
    types += [4, 4]
    scores = [0.0] * 262 + [-float(i) for i in range(len(words))] + [0.0, 0.0]
    return tokens, scores, types


def add_spm_vocab(w: gguf.GGUFWriter, with_size: bool = False) -> int:
    """spm_vocab's tokenizer keys (BOS 2 added, EOS 1, UNK 3, no space prefix) written to w, preceded by
    the vocabulary size when with_size; returns the vocabulary size."""
    tokens, scores, types = spm_vocab()
    if with_size:
        w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)
    return len(tokens)


def write_tiny_qwen2(path, **kw) -> None:
    """A `qwen2` model: the tiny llama with q/k/v biases and NeoX RoPE."""
    write_tiny_llama(path, arch="qwen2", **kw)


def write_tiny_gemma3(path, *, qtype: T = T.Q8_0, n_layer: int = 7, dim: int = 64, n_head: int = 2,
                      n_kv: int = 1, head_dim: int = 32, ffn: int = 128, n_ctx: int = 256, window: int = 8,
                      seed: int = 0, embd_type: T = T.Q8_0) -> None:
    """A `gemma3` model: q/k norms, sliding-window layers (every sixth global), SentencePiece vocabulary."""
    rng = np.random.default_rng(seed)
    tokens, scores, types = spm_vocab()
    vocab = len(tokens)
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_block_count(n_layer)
    w.add_context_length(n_ctx)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_sliding_window(window)
    add_spm_vocab(w)
    add_tensor(w, "token_embd.weight", rng.standard_normal((vocab, dim)) * 0.5, embd_type)
    norm = lambda n: 1 + 0.1 * rng.standard_normal(n)  # noqa: E731
    for i in range(n_layer):
        p = f"blk.{i}."
        add_tensor(w, p + "attn_norm.weight", norm(dim), T.F32)
        add_tensor(w, p + "attn_q.weight", rng.standard_normal((n_head * head_dim, dim)) / np.sqrt(dim) * 3, qtype)
        add_tensor(w, p + "attn_k.weight", rng.standard_normal((n_kv * head_dim, dim)) / np.sqrt(dim) * 3, qtype)
        add_tensor(w, p + "attn_v.weight", rng.standard_normal((n_kv * head_dim, dim)) / np.sqrt(dim), qtype)
        add_tensor(w, p + "attn_q_norm.weight", norm(head_dim), T.F32)
        add_tensor(w, p + "attn_k_norm.weight", norm(head_dim), T.F32)
        add_tensor(w, p + "attn_output.weight", rng.standard_normal((dim, n_head * head_dim)) / np.sqrt(dim), qtype)
        add_tensor(w, p + "post_attention_norm.weight", norm(dim), T.F32)
        add_tensor(w, p + "ffn_norm.weight", norm(dim), T.F32)
        add_tensor(w, p + "ffn_gate.weight", rng.standard_normal((ffn, dim)) / np.sqrt(dim), qtype)
        add_tensor(w, p + "ffn_up.weight", rng.standard_normal((ffn, dim)) / np.sqrt(dim), qtype)
        add_tensor(w, p + "ffn_down.weight", rng.standard_normal((dim, ffn)) / np.sqrt(ffn), qtype)
        add_tensor(w, p + "post_ffw_norm.weight", norm(dim), T.F32)
    add_tensor(w, "output_norm.weight", norm(dim), T.F32)
    finish(w)


def bert_vocab() -> list[str]:
    """A small WordPiece vocabulary as llama.cpp stores it: word-initial pieces start with "▁"."""
    letters = "abcdefghijklmnopqrstuvwxyz0123456789"
    words = ["the", "hen", "sat", "on", "mat", "dog", "ran", "search", "query", "document", "cache", "cat"]
    return (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"▁{w}" for w in words] + ["ing", "s", "ed"]
            + [f"▁{c}" for c in letters] + list(letters) + ["▁.", "▁,", "▁:", "▁!", "▁?"])


def write_tiny_nomic_bert(path, *, n_layer: int = 2, dim: int = 64, n_head: int = 4, ffn: int = 96, n_ctx: int = 128,
                          seed: int = 0, wtype: T = T.F16) -> None:
    """A `nomic-bert` encoder (nomic-embed-text's architecture) with a WordPiece vocabulary."""
    rng = np.random.default_rng(seed)
    tokens = bert_vocab()
    vocab = len(tokens)
    w = gguf.GGUFWriter(str(path), "nomic-bert")
    w.add_block_count(n_layer)
    w.add_context_length(n_ctx)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn)
    w.add_head_count(n_head)
    w.add_layer_norm_eps(1e-12)
    w.add_rope_freq_base(1000.0)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.MEAN)
    w.add_token_type_count(2)
    w.add_tokenizer_model("bert")
    w.add_token_list(tokens)
    w.add_token_types([3] * 5 + [1] * (vocab - 5))
    w.add_bos_token_id(2)
    w.add_unk_token_id(1)
    w.add_sep_token_id(3)
    w.add_pad_token_id(0)
    w.add_mask_token_id(4)
    s = 1 / np.sqrt(dim)
    add_tensor(w, "token_embd.weight", rng.standard_normal((vocab, dim)) * 0.5, wtype)
    add_tensor(w, "token_types.weight", rng.standard_normal((2, dim)) * 0.1, T.F32)
    w.add_tensor("token_embd_norm.weight", (1 + 0.1 * rng.standard_normal(dim)).astype(np.float32))
    w.add_tensor("token_embd_norm.bias", (0.1 * rng.standard_normal(dim)).astype(np.float32))
    for i in range(n_layer):
        p = f"blk.{i}."
        add_tensor(w, p + "attn_qkv.weight", rng.standard_normal((3 * dim, dim)) * s, wtype)
        add_tensor(w, p + "attn_output.weight", rng.standard_normal((dim, dim)) * s, wtype)
        w.add_tensor(p + "attn_output_norm.weight", (1 + 0.1 * rng.standard_normal(dim)).astype(np.float32))
        w.add_tensor(p + "attn_output_norm.bias", (0.1 * rng.standard_normal(dim)).astype(np.float32))
        add_tensor(w, p + "ffn_up.weight", rng.standard_normal((ffn, dim)) * s, wtype)
        add_tensor(w, p + "ffn_gate.weight", rng.standard_normal((ffn, dim)) * s, wtype)
        add_tensor(w, p + "ffn_down.weight", rng.standard_normal((dim, ffn)) / np.sqrt(ffn), wtype)
        w.add_tensor(p + "layer_output_norm.weight", (1 + 0.1 * rng.standard_normal(dim)).astype(np.float32))
        w.add_tensor(p + "layer_output_norm.bias", (0.1 * rng.standard_normal(dim)).astype(np.float32))
    finish(w)
