"""How text is split before a vocabulary's own algorithm runs: llama.cpp's pre-tokenizer regexes for
byte-level BPE (by `tokenizer.ggml.pre`), BERT's word splitting for WordPiece, and the matcher that
finds special-token texts in the raw text first."""

from __future__ import annotations

import re
import unicodedata

# Pre-tokenizer regexes, as llama.cpp's llama-vocab.cpp lists them for each `tokenizer.ggml.pre`.
_GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_RE = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_RE = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
             r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35_RE = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
              r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# gpt-oss's o200k regex, as its tokenizer.json has it (llama.cpp rewrites it without the case-insensitive groups)
_GPT4O_RE = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
             r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
             r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# deepseek's regexes name their letters and CJK ranges code point by code point (escaped here)
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_DEEPSEEK_LLM_RES = [
    "[\r\n]",
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f"
    "\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d"
    "\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
    "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a"
    "\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
    "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    "\\s+$",
    _CJK,
    "\\p{N}+",
]
_DEEPSEEK_CODER_RES = [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"]
_FALCON_RES = [r"[\p{P}\$\+<=>\^~\|`]+", _GPT2_RE, r"[0-9][0-9][0-9]"]
_DIGITS_GPT2 = [r"\p{N}", _GPT2_RE]
# `tokenizer.ggml.pre` -> (regexes applied in order, ignore_merges), as llama.cpp's llama-vocab.cpp has them;
# checked against llama.cpp's own vocabulary test files (tests/test_tokenizer_vocabs.py)
PRE_TOKENIZERS = {
    "default": ([_GPT2_RE], False),
    **{name: ([_GPT2_RE], False) for name in ("gpt2", "gpt-2", "mpt", "phi-2", "olmo", "jais")},
    **{name: (_DIGITS_GPT2, False) for name in ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
                                                "minerva")},
    **{name: ([_LLAMA3_RE], True) for name in ("llama-bpe", "llama3", "llama-v3", "falcon3", "falcon-h1", "pixtral",
                                               "lfm2")},
    **{name: ([_LLAMA3_RE], False) for name in ("dbrx", "smaug-bpe")},
    **{name: ([_QWEN2_RE], False) for name in ("qwen2", "stablelm2", "deepseek-r1-qwen")},
    "qwen35": ([_QWEN35_RE], False),
    "gpt-4o": ([_GPT4O_RE], False),
    "deepseek-llm": (_DEEPSEEK_LLM_RES, False),
    "deepseek-coder": (_DEEPSEEK_CODER_RES, False),
    "falcon": (_FALCON_RES, False),
}


class LiteralMatcher:
    """Finds special-token texts in a string: at the leftmost position where one starts, the longest
    one (what a regex alternation of them, longest first, finds). Indexed by first character and length,
    so building it costs next to nothing even for vocabularies with thousands of special tokens (a
    regex of Gemma 3's 6,400 took a third of a second to compile)."""

    def __init__(self, texts: dict[str, int]):
        self._by_first: dict[str, tuple[list[int], dict[str, int]]] = {}
        for t, i in texts.items():
            lengths, table = self._by_first.setdefault(t[0], ([], {}))
            table[t] = i
        for lengths, table in self._by_first.values():
            lengths.extend(sorted({len(t) for t in table}, reverse=True))
        chars = "".join(sorted(self._by_first))
        self._first = re.compile("[" + re.escape(chars) + "]") if chars else None

    def finditer(self, text: str):
        """(start, end, token id) of each match, left to right, not overlapping."""
        if self._first is None:
            return
        pos = 0
        while True:
            m = self._first.search(text, pos)
            if m is None:
                return
            s = m.start()
            lengths, table = self._by_first[text[s]]
            for n in lengths:
                tid = table.get(text[s:s + n])
                if tid is not None:
                    yield s, s + n, tid
                    pos = s + n
                    break
            else:
                pos = s + 1


# llama.cpp's whitespace set (unicode.cpp), which BERT's word splitting uses
_WS = frozenset([*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F,
                 0x3000])


def _is_cjk(c: int) -> bool:
    return (0x4E00 <= c <= 0x9FFF or 0x3400 <= c <= 0x4DBF or 0x20000 <= c <= 0x2A6DF or 0x2A700 <= c <= 0x2B73F
            or 0x2B740 <= c <= 0x2B81F or 0x2B920 <= c <= 0x2CEAF or 0xF900 <= c <= 0xFAFF or 0x2F800 <= c <= 0x2FA1F)


def wpm_words(text: str, lowercase: bool = True, strip_accents: bool = True) -> list[str]:
    """BERT's pre-tokenization as llama.cpp does it: (NFD and accent marks dropped,) lower-cased, split at
    whitespace, control characters dropped, and every punctuation mark, ASCII symbol and CJK ideograph a
    word of its own."""
    if strip_accents:
        text = unicodedata.normalize("NFD", text)
    words, cur = [], []
    for ch in text:
        c = ord(ch)
        if c in _WS:
            if cur:
                words.append("".join(cur))
                cur = []
            continue
        cat = unicodedata.category(ch)
        if c == 0 or c == 0xFFFD or cat in ("Cc", "Cf", "Co", "Cs"):
            continue
        if strip_accents and cat[0] == "M":
            continue
        if lowercase:
            low = ch.lower()
            ch = low if len(low) == 1 else ch  # the simple (one code point) mapping, as llama.cpp's table
        if cat[0] == "P" or (c < 0x7F and cat[0] == "S") or _is_cjk(c):
            if cur:
                words.append("".join(cur))
                cur = []
            words.append(ch)
        else:
            cur.append(ch)
    if cur:
        words.append("".join(cur))
    return words
