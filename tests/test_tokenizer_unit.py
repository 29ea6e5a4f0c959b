"""Tokenizers on tiny vocabularies, and incremental detokenization."""

import pytest

from edgeinfer.gguf_file import GGUFFile
from edgeinfer.tokenizer import IncrementalDecoder, Tokenizer


@pytest.fixture(scope="module")
def bpe(tiny_llama_path):
    return Tokenizer(GGUFFile(tiny_llama_path))


@pytest.fixture(scope="module")
def spm(tiny_gemma3_path):
    return Tokenizer(GGUFFile(tiny_gemma3_path))


def test_bpe_round_trips_any_text(bpe):
    for text in ["hello world", "the thing", "naïve 🚀\n\tx", ""]:
        assert bpe.decode(bpe.encode(text)) == text


def test_bpe_merges_apply(bpe):
    ids = bpe.encode(" the")
    assert [bpe.tokens[i] for i in ids] == ["Ġthe"]


def test_bpe_special_tokens_only_when_parsing(bpe):
    plain = bpe.encode("<|im_start|>hi")
    parsed = bpe.encode("<|im_start|>hi", parse_special=True)
    assert parsed[0] == bpe.tokens.index("<|im_start|>")
    assert bpe.tokens.index("<|im_start|>") not in plain
    assert bpe.decode(parsed) == "hi"  # control tokens are not text
    assert bpe.decode(parsed, special=True) == "<|im_start|>hi"


def test_spm_merges_by_score_and_falls_back_to_bytes(spm):
    ids = spm.encode("the cat", add_bos=False)
    pieces = [spm.tokens[i] for i in ids]
    assert pieces[0] == "the" or pieces[:2] == ["t", "he"] or pieces[0].startswith("t")
    assert "<0x63>" in pieces  # 'c' is not a piece: byte fallback
    assert spm.decode(ids) == "the cat"


def test_spm_user_defined_pieces_are_always_matched(spm):
    ids = spm.encode("a  b<b>", add_bos=False)
    assert ids == [spm.tokens.index("a"), spm.tokens.index("  "), spm._byte_ids[ord("b")], spm.tokens.index("<b>")]
    assert spm.decode(ids) == "a  b<b>"


def test_spm_bos_as_the_file_says(spm):
    assert spm.encode("a")[0] == spm.bos_id
    assert spm.encode("a", add_bos=False)[0] != spm.bos_id


def test_incremental_decoder_never_splits_utf8(bpe):
    text = "añ🚀é"
    ids = bpe.encode(text)
    assert len(ids) > 4  # byte-level: multi-byte characters span several tokens
    dec = IncrementalDecoder(bpe)
    parts = [dec.push(i) for i in ids] + [dec.flush()]
    assert "".join(parts) == text
    assert all("\ufffd" not in p for p in parts)
