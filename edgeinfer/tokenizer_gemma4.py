"""Gemma 4's tokenizer (`tokenizer.ggml.model` "gemma4"), as llama.cpp's llama-vocab.cpp has it
(LLAMA_VOCAB_PRE_TYPE_GEMMA4):

- BPE by merge rank (`tokenizer.ggml.merges`, each cut at its first space after the first character;
  the first of duplicate merges counts), over raw UTF-8 text, not GPT-2's byte characters;
- each run of text between special tokens has its spaces replaced with "▁" and is cut only at
  newlines (pre-tokenizer `[^\\n]+|[\\n]+`); a run of newlines that is itself a token is that token
  (llama.cpp's PR 21343), any other piece is merged by rank;
- a character no merge covers and no token spells falls back to its bytes' `<0xNN>` tokens (a byte
  without one is dropped, as llama.cpp drops it);
- a BOS token always opens the text, whatever `tokenizer.ggml.add_bos_token` says (llama.cpp's PR 21500);
- the end-of-generation names llama.cpp knows (`<eos>`, `<turn|>`, `<|tool_response>`, ...) are
  control tokens that stop generation, `</s>` a normal token when `<|tool_response>` is there.

The merging is the `tokenizers` library's BPE model (the same rank-then-leftmost order as llama.cpp's).
Decoding is the SentencePiece way (tokenizer.Tokenizer.token_bytes): "▁" back to spaces, `<0xNN>` to
bytes, user-defined tokens (`<|channel>`, `<|tool_call>`, ...) as their text.
"""

from __future__ import annotations

import re
from itertools import chain

import numpy as np

from .errors import EdgeInferError, TokenizerError

NORMAL, CONTROL, USER_DEFINED = 1, 3, 4
_LINES = re.compile(r"[^\n]+|\n+")

# llama-vocab.cpp's end-of-generation token texts: each one in the vocabulary is made a control token
# and ends generation (llama.cpp does this for every vocabulary; edgeinfer only for gemma4's)
EOG_NAMES = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
             "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
             "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
             "<｜end▁of▁sentence｜>", "[e~[")


def _error(message: str) -> Exception:
    return TokenizerError(message)


def gemma4_token_types(tokens: list[str], types: np.ndarray) -> tuple[set[int], set[int]]:
    """Make llama.cpp's end-of-generation tokens control tokens, in `types` (changed in place).
    Returns (ids that end generation, ids that do not even if the file names them EOS or EOT)."""
    ids = {t: i for i, t in enumerate(tokens)}
    stops = set()
    for name in EOG_NAMES:
        i = ids.get(name)
        if i is not None:
            types[i] = CONTROL
            stops.add(i)
    not_stops = set()
    s = ids.get("</s>")
    if s is not None and ids.get("<|tool_response>") is not None:  # Gemma 4's </s> is plain text
        types[s] = NORMAL
        stops.discard(s)
        not_stops.add(s)
    has = {name for name in ("<|return|>", "<|call|>", "<|calls|>", "<|flush|>", "<|end|>") if name in ids}
    call = bool(has & {"<|call|>", "<|calls|>"})
    if "<|end|>" in has and call and has & {"<|return|>", "<|flush|>"}:
        e = ids["<|end|>"]  # harmony's <|end|>: llama.cpp drops it from its EOG list, a user-defined token
        types[e] = USER_DEFINED
        stops.discard(e)
        not_stops.add(e)
    return stops, not_stops


def gemma4_bpe(tokens: list[str], vocab: dict[str, int], merges):
    """The `tokenizers` BPE model of a gemma4 vocabulary, and the number of real token ids (ids at and
    above it stand for byte tokens the vocabulary lacks: they are dropped from the output)."""
    from tokenizers import Tokenizer as HFTokenizer, models

    if merges is None:
        raise _error("a gemma4 vocabulary needs tokenizer.ggml.merges")
    n = len(tokens)
    # llama.cpp's cut: the first space after the first character (a plain split unless a merge starts with one)
    pairs = [tuple(m.split(" ", 1)) if m[:1] != " " else _cut(m) for m in merges]
    if any(len(p) != 2 or not p[0] or not p[1] for p in pairs) or not vocab.keys() >= set(map("".join, pairs)) \
            or not vocab.keys() >= set(chain.from_iterable(pairs)):
        _bad_merge(pairs, merges, vocab)  # (found again, one at a time, to name it)
    pairs = list(dict.fromkeys(pairs))  # llama.cpp keeps the first rank of a pair, the tokenizers library the last
    full = dict(vocab)
    for byte in range(256):  # every character can fall back to bytes; missing byte tokens are dropped later
        full.setdefault(f"<0x{byte:02X}>", n + byte)
    try:
        bpe = models.BPE(vocab=full, merges=pairs, byte_fallback=True)
    except Exception as e:  # the library's own complaint about a vocabulary it cannot take
        raise _error(f"the gemma4 vocabulary cannot be built: {e}") from None
    return HFTokenizer(bpe), n


def _cut(m: str) -> tuple[str, ...]:
    cut = m.find(" ", 1)
    return (m[:cut], m[cut + 1:]) if cut > 0 else (m,)


def _bad_merge(pairs, merges, vocab) -> None:
    for k, p in enumerate(pairs):
        if len(p) != 2 or not p[0] or not p[1]:
            raise _error(f"malformed merge {k} ({merges[k][:40]!r}) in tokenizer.ggml.merges")
        for t in (p[0], p[1], p[0] + p[1]):  # the tokenizers library cannot take a merge outside the vocabulary
            if t not in vocab:
                raise _error(f"merge {k} ({merges[k][:40]!r}) in tokenizer.ggml.merges needs the token {t[:40]!r}, "
                             "which is not in the vocabulary")


def gemma4_encode(bpe, vocab: dict[str, int], n_real: int, text: str) -> list[int]:
    """Token ids of text with no special tokens in it, llama.cpp's way (see the module's docstring)."""
    out: list[int] = []
    words: list[str] = []
    for w in _LINES.findall(text.replace(" ", "▁")):
        tid = vocab.get(w) if w[0] == "\n" else None
        if tid is None:
            words.append(w)
            continue
        out += _merge(bpe, words, n_real)
        words = []
        out.append(tid)
    return out + _merge(bpe, words, n_real)


def _merge(bpe, words: list[str], n_real: int) -> list[int]:
    if not words:
        return []
    try:
        ids = bpe.encode(words, is_pretokenized=True, add_special_tokens=False).ids
    except Exception as e:  # noqa: BLE001 (the library's errors are not one class)
        raise EdgeInferError(f"the gemma4 tokenizer failed: {e}") from None
    return [i for i in ids if i < n_real]
