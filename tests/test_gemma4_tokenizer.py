"""Gemma 4's tokenizer (`tokenizer.ggml.model` "gemma4": BPE by merge rank over text whose spaces are "▁",
cut only at newlines, byte fallback to <0xNN>) against llama.cpp, on a small vocabulary written here that
has each of its corners: a newline run that is a token no merge reaches, a duplicated merge, a control
</s> (llama.cpp makes it plain text), a user-defined <|tool_response> (llama.cpp makes it a control token
that ends generation), a missing byte token, characters outside the vocabulary.

The tokens and text llama.cpp gives (llama-cpp-python 0.3.36, vocab_only, on this file) are kept below, so
the checks run without it. The real Gemma 4 vocabulary of llama.cpp's tokenizer test set is checked too
(marked `model`: it is fetched once with the other ggml-vocab files)."""

import gguf
import pytest

from edgeinfer.gguf_file import GGUFFile
from edgeinfer.tokenizer import IncrementalDecoder, Tokenizer, TokenizerError

SPECIALS = [("<pad>", 3), ("<eos>", 3), ("<bos>", 3), ("<unk>", 2), ("<mask>", 3), ("<|turn>", 3), ("<turn|>", 3),
            ("<|think|>", 3), ("<|channel>", 4), ("<channel|>", 4), ("<|tool_call>", 4), ("<tool_call|>", 4),
            ("<|tool_response>", 4), ("<tool_response|>", 4), ('<|"|>', 4), ("</s>", 3)]
CHARS = list("▁\n\tabcdeghilnorstwxyzHT.,!?'<>/|:é")
MERGES = ["▁ ▁", "▁▁ ▁▁", "▁ t", "h e", "▁t he", "i n", "in g", "t h", "th ing", "H e", "l l", "He ll", "Hell o",
          "o r", "▁ w", "▁w or", "l d", "▁wor ld", "\n \n", "\n\n \n", "a b", "b c", "< /", "</ s", "</s >",
          "é t", "▁ é", "a b"]  # the last: a duplicate, of lower priority than "b c" (llama.cpp keeps the first)
MISSING_BYTE = 0xF0  # no <0xF0> token: a 4-byte character loses its first byte, as in llama.cpp
UNREACHED = ["\n\n\n\n", "xyz"]  # tokens no merge makes: only a newline run is taken whole


def vocabulary() -> tuple[list[str], list[int]]:
    tokens = [t for t, _ in SPECIALS] + CHARS
    types = [k for _, k in SPECIALS] + [1] * len(CHARS)
    for b in range(256):
        if b != MISSING_BYTE:
            tokens.append(f"<0x{b:02X}>")
            types.append(6)
    for m in MERGES:
        a, b = m.split(" ")
        assert a in tokens and b in tokens, m
        if a + b not in tokens:
            tokens.append(a + b)
            types.append(1)
    tokens += UNREACHED
    types += [1] * len(UNREACHED)
    return tokens, types


def write_vocab(path, *, model: str = "gemma4", merges=None, tokens=None) -> None:
    """A vocabulary-only GGUF (arch `llama`, so llama-cpp-python loads it with vocab_only). The file says
    add_bos_token false, which llama.cpp overrides for Gemma 4."""
    toks, types = vocabulary()
    if tokens is not None:
        toks, types = tokens, [1] * len(tokens)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(8)
    w.add_head_count(1)
    w.add_tokenizer_model(model)
    w.add_token_list(toks)
    w.add_token_types(types)
    if merges is not False:
        w.add_token_merges(MERGES if merges is None else merges)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def vocab_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("gemma4") / "gemma4-vocab.gguf"
    write_vocab(p)
    return p


@pytest.fixture(scope="module")
def tok(vocab_path):
    return Tokenizer(GGUFFile(vocab_path))


# text -> the pieces llama.cpp gives (no BOS, special tokens not parsed); <0xNN> are byte tokens
EXPECTED = {
    "": [],
    " ": ["▁"],
    "  ": ["▁▁"],
    "     ": ["▁▁▁▁", "▁"],
    "   the": ["▁▁", "▁the"],
    "the   ": ["t", "he", "▁▁", "▁"],
    "the thing": ["t", "he", "▁t", "h", "ing"],  # "▁ t" ranks before "t h"
    "Hello world": ["Hello", "▁world"],
    "Hello  world !": ["Hello", "▁▁", "w", "or", "ld", "▁", "!"],
    "abc": ["ab", "c"],  # "a b" before "b c": the first rank of the duplicated merge counts
    "xyz": ["x", "y", "z"],  # a token, but only merges make tokens of a line
    "\n": ["\n"],
    "\n\n\n": ["\n\n\n"],
    "\n\n\n\n": ["\n\n\n\n"],  # a newline run that is a token is that token (llama.cpp's PR 21343)
    "\n\n\n\n\n": ["\n\n", "\n\n\n"],
    "a\n\n\n\nb": ["a", "\n\n\n\n", "b"],
    " \n \n": ["▁", "\n", "▁", "\n"],
    "\r\n\tx": ["<0x0D>", "\n", "\t", "x"],
    "été ö": ["ét", "é", "▁", "<0xC3>", "<0xB6>"],
    "中": ["<0xE4>", "<0xB8>", "<0xAD>"],
    "😀!": ["<0x9F>", "<0x98>", "<0x80>", "!"],  # no <0xF0>: that byte is dropped
    "</s>": ["</s>"],  # a control token in the file, plain text here (llama.cpp: Gemma 4's </s> is normal)
    "<eos>x": ["<", "e", "o", "s", ">", "x"],
    "<|tool_response>": ["<", "|", "t", "o", "o", "l", "<0x5F>", "r", "e", "s", "<0x70>", "o", "n", "s", "e", ">"],
    "a<|channel>b": ["a", "<|channel>", "b"],  # user-defined: matched even when special tokens are not parsed
    "x ▁y": ["x", "▁▁", "y"],  # a literal ▁ is a space to the tokenizer
    "<turn|> tail  \n\n\n\n\n\n\n\n\n x": ["<", "t", "<0x75>", "r", "n", "|", ">", "▁t", "a", "i", "l", "▁▁", "\n\n",
                                          "\n\n", "\n\n", "\n\n\n", "▁", "x"],
    "Hello\n\nworld  ": ["Hello", "\n\n", "w", "or", "ld", "▁▁"],
    "'?,.:|/ Tt ee": ["'", "?", ",", ".", ":", "|", "/", "▁", "T", "t", "▁", "e", "e"],
    "é" * 9 + " é é": ["é"] * 9 + ["▁é", "▁é"],
    "\t\t \n\r\r": ["\t", "\t", "▁", "\n", "<0x0D>", "<0x0D>"],
}
# the same with special tokens parsed
EXPECTED_SPECIAL = {
    "<eos>x": ["<eos>", "x"],
    "<|tool_response>": ["<|tool_response>"],
    "<|turn>user\nHi<turn|>\n<|turn>model\n": ["<|turn>", "<0x75>", "s", "e", "r", "\n", "H", "i", "<turn|>", "\n",
                                              "<|turn>", "<0x6D>", "o", "d", "e", "l", "\n"],
    "<bos><|channel>thought\n<channel|> ok": ["<bos>", "<|channel>", "th", "o", "<0x75>", "g", "h", "t", "\n",
                                              "<channel|>", "▁", "o", "<0x6B>"],
    "</s><unk>": ["</s>", "<unk>"],
    "<turn|> tail  \n\n\n\n\n\n\n\n\n x": ["<turn|>", "▁t", "a", "i", "l", "▁▁", "\n\n", "\n\n", "\n\n", "\n\n\n", "▁",
                                          "x"],
}
# what llama.cpp's detokenizer gives back for the tokens of each text above where that is not the text
DECODED = {"😀!": b"\x9f\x98\x80!", "x ▁y": b"x  y"}


def pieces(tok: Tokenizer, ids) -> list[str]:
    return [tok.tokens[i] for i in ids]


def test_tokens_as_llama_cpp_gives_them(tok):
    for text, want in EXPECTED.items():
        assert pieces(tok, tok.encode(text, add_bos=False)) == want, text
    for text, want in EXPECTED_SPECIAL.items():
        assert pieces(tok, tok.encode(text, add_bos=False, parse_special=True)) == want, text


def test_bos_always_opens_the_text(tok):
    """The file says add_bos_token false; llama.cpp adds the BOS for Gemma 4 anyway (its PR 21500)."""
    assert tok.add_bos and tok.encode("ab")[0] == tok.bos_id == 2
    assert tok.encode("ab", add_bos=False) == [tok.tokens.index("ab")]


def test_end_of_generation_tokens(tok):
    t = tok.tokens.index
    assert tok.stop_ids == {t("<eos>"), t("<turn|>"), t("<|tool_response>")}  # not </s>
    assert tok.decode([t("<|tool_response>"), t("ab")]) == "ab"  # a control token now: no text unless asked
    assert tok.decode([t("<|tool_response>"), t("</s>")], special=True) == "<|tool_response></s>"
    assert tok.decode([t("</s>")]) == "</s>"


@pytest.mark.parametrize("special", [False, True])
def test_the_text_back_as_llama_cpp_gives_it(tok, special):
    """Every text of both tables, encoded either way (with or without parsing special tokens), decodes to
    the bytes llama.cpp's detokenizer gives for the same tokens (the text, but for a dropped byte and ▁)."""
    for text in list(EXPECTED) + list(EXPECTED_SPECIAL):
        ids = tok.encode(text, add_bos=False, parse_special=special)
        assert tok.decode_bytes(ids, special=special) == DECODED.get(text, text.encode()), text


def test_round_trip(tok):
    for text in ["Hello world", "  the  thing  ", "\n\n\n\nabc\n", "été ö 中", "tab\there\r\n", ""]:
        assert tok.decode(tok.encode(text)) == text
    text = "<|turn>user\nHi</s><turn|>\n"
    assert tok.decode(tok.encode(text, add_bos=False, parse_special=True), special=True) == text
    assert tok.decode(tok.encode("😀")) == "\ufffd" * 3  # its first byte has no token: lost, as in llama.cpp


def test_incremental_decoding_never_splits_a_character(tok):
    ids = tok.encode("ö 中 é", add_bos=False)
    dec = IncrementalDecoder(tok)
    parts = [dec.push(i) for i in ids] + [dec.flush()]
    assert "".join(parts) == "ö 中 é" and all("\ufffd" not in p for p in parts)


@pytest.mark.parametrize("kind,kwargs,match", [
    ("no merges", {"merges": False}, "needs tokenizer.ggml.merges"),
    ("merge without a space", {"merges": ["ab"]}, "malformed merge 0"),
    ("merge with an empty side", {"merges": ["a "]}, "malformed merge 0"),
    ("merge of a missing token", {"merges": ["a q"]}, "needs the token 'q'"),
    ("merge making a missing token", {"merges": ["a b", "▁ a"]}, "needs the token '▁a'"),
    ("unknown model", {"model": "gemma5"}, "tokenizer 'gemma5' is not supported"),
])
def test_garbled_vocabularies_are_a_clear_error(tmp_path, kind, kwargs, match):
    p = tmp_path / "bad.gguf"
    write_vocab(p, **kwargs)
    with pytest.raises(TokenizerError, match=match):
        Tokenizer(GGUFFile(p))


@pytest.mark.model
def test_llama_cpps_gemma4_vocabulary():
    """ggml-vocab-gemma-4.gguf, the real 262k vocabulary, with its .inp/.out expected tokenizations (made
    with the Hugging Face tokenizer), and round trips; and live against llama.cpp where it is installed."""
    from test_tokenizer_vocabs import SEP, vocab_dir

    path = vocab_dir() / "ggml-vocab-gemma-4.gguf"
    tok = Tokenizer(GGUFFile(path))
    inputs = path.with_name(path.name + ".inp").read_text(encoding="utf-8").split(SEP)
    outputs = path.with_name(path.name + ".out").read_text(encoding="utf-8").split("\n")
    assert len(outputs) >= len(inputs) > 10
    for text, line in zip(inputs, outputs):
        ids = tok.encode(text, add_bos=False)
        assert ids == [int(x) for x in line.split()], text
        assert tok.decode(ids) == text
    t = tok.tokens.index
    assert tok.stop_ids == {t("<eos>"), t("<turn|>"), t("<|tool_response>")} and tok.add_bos
    try:
        import llama_cpp
    except ImportError:
        return
    llama = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    chat = "<bos><|turn>system\n<|think|>\nBe brief.<turn|>\n<|turn>user\nHi  there\n\n\n<turn|>\n<|turn>model\n"
    for text in inputs + [chat, "<|channel>thought\nplan<channel|>answer", "a\n\n\n\n\n\n\n\n\n\n\n\n\n\nb"]:
        for special in (False, True):
            assert tok.encode(text, parse_special=special) == llama.tokenize(text.encode(), special=special), text
