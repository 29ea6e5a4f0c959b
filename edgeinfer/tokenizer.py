"""Tokenizers built from a GGUF vocabulary, matching llama.cpp token for token.

- ``gpt2`` (byte-level BPE): the `tokenizers` library with the pre-tokenizer `tokenizer.ggml.pre` names.
- ``llama`` (SentencePiece BPE): llama.cpp's algorithm, here in Python: merge the adjacent pair whose
  merged piece scores highest, until no adjacent pair forms a piece; unknown characters fall back to
  byte pieces ``<0xNN>``. Building it is a dict of the pieces (a few tens of ms for 262k pieces).
- ``gemma4`` (Gemma 4: BPE by merge rank over SentencePiece-style text): spaces become ``▁``, the text is
  cut only at newlines (a run of newlines that is a token is taken whole), and the `tokenizers` library
  merges each line by rank, unknown characters falling back to ``<0xNN>`` pieces (tokenizer_gemma4.py).

Control and user-defined tokens are matched in the raw text before either algorithm runs, longest
first; control tokens only when ``parse_special`` is set, user-defined ones always (as llama.cpp).
That matching and the splitting before the algorithms (pre-tokenizer regexes, BERT's words) are in
pretokenize.py.
"""

from __future__ import annotations

import heapq
from typing import Iterable

import numpy as np

from .errors import EdgeInferError, TokenizerError  # noqa: F401  (TokenizerError: imported from here)
from .gguf_file import GGUFFile
from .pretokenize import PRE_TOKENIZERS, LiteralMatcher, wpm_words
from .tokenizer_gemma4 import gemma4_bpe, gemma4_encode, gemma4_token_types

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table of byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_BYTE_ENCODER = bytes_to_unicode()
_BYTE_DECODER = {c: b for b, c in _BYTE_ENCODER.items()}


class Tokenizer:
    """Text <-> token ids for one GGUF vocabulary."""

    def __init__(self, gf: GGUFFile):
        tokens = gf.get("tokenizer.ggml.tokens")
        if tokens is None:
            raise TokenizerError("the GGUF file has no vocabulary (tokenizer.ggml.tokens)")
        self.model = gf.get("tokenizer.ggml.model", "llama")
        self.tokens: list[str] = tokens
        n = len(tokens)
        types = gf.get("tokenizer.ggml.token_type")
        self.token_types = np.array(types, np.int32) if types is not None else np.full(n, NORMAL, np.int32)
        if self.token_types.ndim != 1 or len(self.token_types) != n:
            raise TokenizerError(f"tokenizer.ggml.token_type has {self.token_types.size} entries for {n} tokens")
        gemma4_stops: set[int] = set()
        gemma4_not_stops: set[int] = set()
        if self.model == "gemma4":  # llama.cpp's end-of-generation names become control tokens (before matching)
            gemma4_stops, gemma4_not_stops = gemma4_token_types(tokens, self.token_types)
        self.bos_id = self._opt_id(gf, "tokenizer.ggml.bos_token_id")
        self.eos_id = self._opt_id(gf, "tokenizer.ggml.eos_token_id")
        self.eot_id = self._opt_id(gf, "tokenizer.ggml.eot_token_id")
        self.add_bos = bool(gf.get("tokenizer.ggml.add_bos_token", self.model in ("llama", "bert")))
        if self.model == "gemma4":
            self.add_bos = True  # llama.cpp overrides a file's false for Gemma 4 (its PR 21500)
        self.add_eos = bool(gf.get("tokenizer.ggml.add_eos_token", False))
        # SentencePiece vocabularies put a space in front of the text unless the file says not to (llama.cpp's rule)
        self.add_space_prefix = bool(gf.get("tokenizer.ggml.add_space_prefix", self.model == "llama"))
        self.vocab_size = n
        special = [int(i) for i in np.nonzero(np.isin(self.token_types, (CONTROL, USER_DEFINED, UNKNOWN)))[0]
                   if tokens[i]]
        self._special_text = {tokens[i]: i for i in special}
        self._match_all = LiteralMatcher({tokens[i]: i for i in special})
        self._match_user = LiteralMatcher({tokens[i]: i for i in special if self.token_types[i] == USER_DEFINED})
        # Tokens that end a turn: EOS, EOT, and the control tokens chat templates end a message with.
        stops = {i for i in (self.eos_id, self.eot_id) if i is not None} | gemma4_stops
        # harmony (gpt-oss: <|return|> and <|call|>): <|end|> ends a message within a reply, not the reply
        harmony = "<|return|>" in self._special_text and "<|call|>" in self._special_text
        for name in ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|endoftext|>", "<|end|>", "<|return|>",
                     "<|call|>"):  # (<|eom_id|>: Llama 3.1 ends a <|python_tag|> call with it; llama.cpp's EOG too)
            i = self._special_text.get(name)
            if i is not None and self.token_types[i] == CONTROL and not (harmony and name == "<|end|>"):
                stops.add(i)
        if harmony and "<|end|>" in self._special_text:  # even where the file names it its end-of-turn token
            stops.discard(self._special_text["<|end|>"])  # (llama.cpp drops it from its EOG list)
        self.stop_ids = frozenset(stops - gemma4_not_stops)

        if self.model == "gpt2":
            self._init_bpe(gf)
        elif self.model == "llama":
            self._init_spm(gf)
        elif self.model == "bert":
            self._init_wpm(gf)
        elif self.model == "gemma4":
            self._piece = {t: i for i, t in enumerate(self.tokens)}  # later duplicates win, as llama.cpp's map
            self._bpe, self._n_real = gemma4_bpe(self.tokens, self._piece, gf.get("tokenizer.ggml.merges"))
        else:
            raise TokenizerError(f"tokenizer {self.model!r} is not supported (supported: gpt2 byte-level BPE, "
                                 f"llama SentencePiece, bert WordPiece, gemma4 BPE)")

    # -- construction ----------------------------------------------------------------------------

    def _opt_id(self, gf: GGUFFile, key: str) -> int | None:
        v = gf.get(key)
        if v is None:
            return None
        if not 0 <= int(v) < len(self.tokens):
            raise TokenizerError(f"{key} = {v} is outside the vocabulary of {len(self.tokens)} tokens")
        return int(v)

    def _init_bpe(self, gf: GGUFFile) -> None:
        from tokenizers import Regex, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers

        merges = gf.get("tokenizer.ggml.merges")
        if merges is None:
            raise TokenizerError("a gpt2 vocabulary needs tokenizer.ggml.merges")
        pre = gf.get("tokenizer.ggml.pre", "default")
        if pre not in PRE_TOKENIZERS:
            raise TokenizerError(
                f"pre-tokenizer {pre!r} is not supported (supported: {', '.join(sorted(PRE_TOKENIZERS))})"
            )
        regexes, ignore_merges = PRE_TOKENIZERS[pre]
        vocab = {t: i for i, t in enumerate(self.tokens)}
        pairs = []
        for k, m in enumerate(merges):  # checked here: the tokenizers library panics on a missing token
            a, sep, b = m.partition(" ")
            if not sep or not a or not b:
                raise TokenizerError(f"malformed merge {k} ({m[:40]!r}) in tokenizer.ggml.merges")
            for t in (a, b, a + b):
                if t not in vocab:
                    raise TokenizerError(f"merge {k} ({m[:40]!r}) in tokenizer.ggml.merges needs the token "
                                         f"{t[:40]!r}, which is not in the vocabulary")
            pairs.append((a, b))
        bpe = models.BPE(vocab=vocab, merges=pairs, ignore_merges=ignore_merges)
        tk = HFTokenizer(bpe)
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
        tk.decoder = decoders.ByteLevel()
        self._bpe = tk

    def _init_spm(self, gf: GGUFFile) -> None:
        scores = gf.get("tokenizer.ggml.scores")
        self._scores = np.asarray(scores, np.float32) if scores is not None else np.zeros(len(self.tokens), np.float32)
        if len(self._scores) != len(self.tokens):
            raise TokenizerError(f"tokenizer.ggml.scores has {len(self._scores)} entries for {len(self.tokens)} tokens")
        self._piece = dict(zip(self.tokens, range(len(self.tokens))))  # later duplicates win, as before
        self._byte_ids = [self._piece.get(f"<0x{b:02X}>") for b in range(256)]
        self._unk_id = self._opt_id(gf, "tokenizer.ggml.unknown_token_id")

    def _init_wpm(self, gf: GGUFFile) -> None:
        # BERT's WordPiece as llama.cpp stores it: word-initial pieces start with "▁", continuations have
        # no "##"; [CLS] (the BOS id, 101 by default) opens the text and [SEP] (102) closes it
        self._piece = {t: i for i, t in enumerate(self.tokens)}
        self._max_piece = max(len(t) for t in self.tokens)
        self._unk_id = self._opt_id(gf, "tokenizer.ggml.unknown_token_id")
        if self._unk_id is None:
            self._unk_id = 100 if len(self.tokens) > 100 else 0
        if self.bos_id is None and len(self.tokens) > 101:
            self.bos_id = 101
        self.sep_id = self._opt_id(gf, "tokenizer.ggml.seperator_token_id")
        if self.sep_id is None and len(self.tokens) > 102:
            self.sep_id = 102
        # BertNormalizer: lower-case, and strip accents unless the file says otherwise
        self._lowercase = bool(gf.get("tokenizer.ggml.normalizer.lowercase", True))
        self._strip_accents = bool(gf.get("tokenizer.ggml.normalizer.strip_accents", self._lowercase))

    # -- encoding --------------------------------------------------------------------------------

    def encode(self, text: str, add_bos: bool | None = None, parse_special: bool = False) -> list[int]:
        """Token ids of `text`. add_bos None: as the GGUF file says."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, not {type(text).__name__}")
        ids: list[int] = []
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids.append(self.bos_id)
        matcher = self._match_all if parse_special else self._match_user
        first = True
        pos = 0
        for start, end, tid in matcher.finditer(text):
            if start > pos:
                ids += self._encode_raw(text[pos:start], first)
            ids.append(tid)
            pos = end
            first = False
        if pos < len(text):
            ids += self._encode_raw(text[pos:], first)
        if self.model == "bert" and (self.add_bos if add_bos is None else add_bos) and self.sep_id is not None:
            ids.append(self.sep_id)  # [SEP] goes with [CLS], as llama.cpp adds both
        elif self.add_eos and self.eos_id is not None and add_bos is None:
            ids.append(self.eos_id)
        return ids

    def _encode_raw(self, text: str, first: bool) -> list[int]:
        if self.model == "gpt2":
            return self._bpe.encode(text, add_special_tokens=False).ids
        if self.model == "bert":
            return self._wpm(text)
        if self.model == "gemma4":
            return gemma4_encode(self._bpe, self._piece, self._n_real, text)
        if self.add_space_prefix and first:
            text = " " + text
        return self._spm(text.replace(" ", "▁"))

    def _spm(self, text: str) -> list[int]:
        # llama.cpp's SentencePiece BPE: symbols are characters; repeatedly merge the adjacent pair
        # whose concatenation is a piece with the highest score (ties: leftmost).
        if not text:
            return []
        piece, scores = self._piece, self._scores
        syms = list(text)
        n = len(syms)
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        heap: list[tuple[float, int, int, str]] = []

        def push(left: int) -> None:
            right = nxt[left]
            if right < 0:
                return
            merged = syms[left] + syms[right]
            tid = piece.get(merged)
            if tid is not None:
                heapq.heappush(heap, (-float(scores[tid]), left, right, merged))

        for i in range(n - 1):
            push(i)
        while heap:
            _, left, right, merged = heapq.heappop(heap)
            # stale entries: a side already merged into something else
            if syms[left] is None or nxt[left] != right or syms[left] + (syms[right] or "") != merged:
                continue
            syms[left] = merged
            syms[right] = None
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            if prev[left] >= 0:
                push(prev[left])
            push(left)
        out: list[int] = []
        i = 0
        while i >= 0:
            s = syms[i]
            tid = piece.get(s)
            if tid is not None:
                out.append(tid)
            else:
                for b in s.encode("utf-8"):
                    bid = self._byte_ids[b]
                    if bid is not None:
                        out.append(bid)
                    elif self._unk_id is not None:
                        out.append(self._unk_id)
            i = nxt[i]
        return out

    def _wpm(self, text: str) -> list[int]:
        # llama.cpp's WordPiece: each word, with "▁" in front, is cut greedily into the longest pieces
        # from the left; a word with a part no piece covers becomes one unknown token
        piece, longest = self._piece, self._max_piece
        out: list[int] = []
        for word in wpm_words(text, self._lowercase, self._strip_accents):
            w = "▁" + word
            n, start, i = len(w), len(out), 0
            while i < n:
                for j in range(min(n, i + longest), i, -1):
                    tid = piece.get(w[i:j])
                    if tid is not None:
                        out.append(tid)
                        i = j
                        break
                else:
                    del out[start:]
                    break
            if len(out) == start:
                out.append(self._unk_id)
        return out

    # -- decoding --------------------------------------------------------------------------------

    def token_bytes(self, tid: int, special: bool = False) -> bytes:
        """The bytes token `tid` stands for. Control tokens are empty unless `special`."""
        if not 0 <= tid < self.vocab_size:
            raise ValueError(f"token id {tid} is outside the vocabulary of {self.vocab_size} tokens")
        t = self.token_types[tid]
        text = self.tokens[tid]
        if t in (CONTROL, UNKNOWN, UNUSED):
            return text.encode("utf-8") if special else b""
        if t == USER_DEFINED:
            return text.encode("utf-8")
        if self.model == "gpt2":
            try:
                return bytes(_BYTE_DECODER[c] for c in text)
            except KeyError:
                return text.encode("utf-8")
        if t == BYTE:
            return bytes([int(text[3:5], 16)])
        return text.replace("▁", " ").encode("utf-8")

    def decode_bytes(self, ids: Iterable[int], special: bool = False) -> bytes:
        return b"".join(self.token_bytes(int(i), special) for i in ids)

    def decode(self, ids: Iterable[int], special: bool = False) -> str:
        ids = list(ids)
        data = self.decode_bytes(ids, special)
        if (self.model == "bert" or self.model == "llama" and self.add_space_prefix) and data.startswith(b" "):
            data = data[1:]  # the space the encoder put in front
        return data.decode("utf-8", errors="replace")


class IncrementalDecoder:
    """Turns a growing list of token ids into text deltas, never splitting a UTF-8 character."""

    def __init__(self, tokenizer: Tokenizer, skip_leading_space: bool = False, special: bool = False):
        self.tok = tokenizer
        self.pending = b""
        self.skip_leading_space = skip_leading_space
        self.special = special  # control tokens' text too

    def push(self, tid: int) -> str:
        self.pending += self.tok.token_bytes(tid, self.special)
        if self.skip_leading_space and self.pending:
            if self.pending.startswith(b" "):
                self.pending = self.pending[1:]
            self.skip_leading_space = False
        # emit the longest prefix that is complete UTF-8
        data = self.pending
        cut = len(data)
        for back in range(1, min(4, len(data)) + 1):
            b = data[-back]
            if b & 0xC0 == 0x80:
                continue  # continuation byte: keep looking for the lead byte
            need = 1 if b < 0x80 else 2 if b >> 5 == 0b110 else 3 if b >> 4 == 0b1110 else 4 if b >> 3 == 0b11110 else 1
            if need > back:
                cut = len(data) - back
            break
        out, self.pending = data[:cut], data[cut:]
        return out.decode("utf-8", errors="replace")

    def flush(self) -> str:
        out, self.pending = self.pending, b""
        return out.decode("utf-8", errors="replace")
