"""Embeddings on tiny models: the nomic-bert encoder against a plain numpy implementation of the same
architecture, the WordPiece tokenizer's rules, LLM.embed's options and errors, decoder-model embeddings,
and the `embed` command."""

import json

import gguf
import numpy as np
import pytest
from click.testing import CliRunner

from edgeinfer import LLM, SamplingParams
from edgeinfer.cli.main import main
from edgeinfer.engine.llm_engine import PromptTooLongError
from edgeinfer.llm import NotAGeneratorError


@pytest.fixture(scope="module")
def enc(tiny_nomic_path):
    return LLM(str(tiny_nomic_path), progress=False)


def reference_embedding(path, ids: list[int]) -> np.ndarray:
    """nomic-bert written out plainly from the file's tensors (float64): embeddings + token type 0,
    LayerNorm; per layer fused QKV, NeoX RoPE (base from the file), softmax attention over all tokens,
    output projection, residual, LayerNorm, SwiGLU, residual, LayerNorm; mean pooling; L2 norm."""
    r = gguf.GGUFReader(str(path))
    t = {x.name: np.array(x.data, np.float64).reshape([int(d) for d in reversed(x.shape)]) for x in r.tensors}
    f = {k: r.fields[k] for k in r.fields}
    val = lambda k: f[k].parts[f[k].data[0]][0]  # noqa: E731
    n_layer, n_head = int(val("nomic-bert.block_count")), int(val("nomic-bert.attention.head_count"))
    eps, base = float(val("nomic-bert.attention.layer_norm_epsilon")), float(val("nomic-bert.rope.freq_base"))

    def ln(x, w, b):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w + b

    x = t["token_embd.weight"][ids] + t["token_types.weight"][0]
    x = ln(x, t["token_embd_norm.weight"], t["token_embd_norm.bias"])
    n, d = x.shape
    hd = d // n_head
    half = hd // 2
    ang = np.arange(n)[:, None] * base ** (-np.arange(half) * 2.0 / hd)[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(v):  # (n, H, hd), pairs (i, i + hd/2)
        a, b = v[..., :half], v[..., half:]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], -1)

    for i in range(n_layer):
        p = f"blk.{i}."
        qkv = x @ t[p + "attn_qkv.weight"].T
        q, k, v = (qkv[:, j * d:(j + 1) * d].reshape(n, n_head, hd) for j in range(3))
        q, k = rope(q), rope(k)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        att = np.einsum("hqk,khd->qhd", s, v).reshape(n, d)
        x = ln(att @ t[p + "attn_output.weight"].T + x, t[p + "attn_output_norm.weight"], t[p + "attn_output_norm.bias"])
        g = x @ t[p + "ffn_gate.weight"].T
        ff = (g / (1 + np.exp(-g))) * (x @ t[p + "ffn_up.weight"].T)
        x = ln(ff @ t[p + "ffn_down.weight"].T + x, t[p + "layer_output_norm.weight"], t[p + "layer_output_norm.bias"])
    e = x.mean(0)
    return e / np.linalg.norm(e)


TEXTS = ["the hen sat on the mat.", "search_query: the dog ran!", "cats", "a", "the cat sat on the dog, the hen ran"]


def test_encoder_matches_a_plain_implementation(enc, tiny_nomic_path):
    got = enc.embed(TEXTS)
    assert got.dtype == np.float32 and got.shape == (len(TEXTS), enc.config.dim)
    for text, v in zip(TEXTS, got):
        want = reference_embedding(tiny_nomic_path, enc.tokenize(text, add_bos=None))
        assert np.dot(v, want) > 0.99999, text
        np.testing.assert_allclose(v, want, atol=2e-5)


def test_texts_batched_or_alone_agree(enc):
    together = enc.embed(TEXTS)
    for text, v in zip(TEXTS, together):
        np.testing.assert_allclose(enc.embed(text), v, atol=1e-5)
    small = enc.embed(TEXTS, batch_tokens=8)  # one text per pass
    np.testing.assert_allclose(small, together, atol=1e-5)


def test_wordpiece_rules(enc):
    tok = enc.tokenizer
    ids = enc.tokenize("The hens sat.", add_bos=None)
    assert [tok.tokens[i] for i in ids] == ["[CLS]", "▁the", "▁hen", "s", "▁sat", "▁.", "[SEP]"]
    assert enc.tokenize("the", add_bos=False) == [tok._piece["▁the"]]  # no [CLS]/[SEP] without specials
    # accents stripped and lower-cased (BertNormalizer), punctuation its own word
    assert enc.tokenize("Cafë,DOG", add_bos=False) == enc.tokenize("cafe , dog", add_bos=False)
    # a word with a character no piece covers is one [UNK]
    assert enc.tokenize("hen ∂x hen", add_bos=False) == [tok._piece["▁hen"], tok._unk_id, tok._piece["▁hen"]]
    assert enc.tokenizer.decode(enc.tokenize("the hens sat.", add_bos=False)) == "the hens sat ."


def test_embed_options(enc):
    full = enc.embed(TEXTS[:2])
    raw = enc.embed(TEXTS[:2], normalize=False)
    assert np.abs(np.linalg.norm(raw, axis=1) - 1).max() > 1e-3  # really not normalised
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), full, atol=1e-6)
    short = enc.embed(TEXTS[:2], dimensions=16)
    assert short.shape == (2, 16)
    np.testing.assert_allclose(np.linalg.norm(short, axis=1), 1, atol=1e-6)
    cut = raw[:, :16] / np.linalg.norm(raw[:, :16], axis=1, keepdims=True)
    np.testing.assert_allclose(short, cut, atol=1e-6)
    ids = enc.tokenize(TEXTS[0], add_bos=None)
    np.testing.assert_allclose(enc.embed([ids])[0], full[0], atol=1e-6)  # token ids as input
    cls = enc.embed(TEXTS[:1], pooling="cls")
    assert abs(float(cls[0] @ full[0])) < 0.9999  # another pooling, another vector


def test_long_texts_are_an_error_or_truncated(enc):
    long = " ".join(["hen"] * 200)  # 202 tokens with [CLS] and [SEP]; the context is 128
    with pytest.raises(PromptTooLongError, match="text 1 has 202 tokens but the context holds 128"):
        enc.embed(["the hen", long])
    seqs = enc.embed_tokens([long], truncate=True)
    assert len(seqs[0]) == 128 and seqs[0][0] == enc.tokenizer.bos_id and seqs[0][-1] == enc.tokenizer.sep_id
    v = enc.embed([long], truncate=True)
    assert v.shape == (1, enc.config.dim)


@pytest.mark.parametrize("texts, message", [
    ([], "non-empty list"),
    ("x" and [[]], "text 0 is empty"),
    ([[10**6]], "outside the vocabulary"),
    ([3.5], "must be a string or a list of token ids"),
])
def test_bad_inputs(enc, texts, message):
    with pytest.raises(ValueError, match=message):
        enc.embed(texts)


def test_bad_options(enc):
    with pytest.raises(ValueError, match="dimensions must be an integer in"):
        enc.embed(["x"], dimensions=10_000)
    with pytest.raises(ValueError, match="pooling must be"):
        enc.embed(["x"], pooling="max")


def test_an_encoder_does_not_generate(enc):
    with pytest.raises(NotAGeneratorError, match="is an embedding model"):
        enc.generate("the hen", SamplingParams(max_tokens=3))
    with pytest.raises(NotAGeneratorError):
        enc.chat([{"role": "user", "content": "hi"}])
    with pytest.raises(Exception, match="embedding model"):
        LLM(enc.path, progress=False, speculate="lookup")


def test_decoder_models_embed_their_final_hidden_state(tiny_llama_path):
    """A generative model's embedding: the mean (or last) of its final hidden states after the output norm,
    computed outside the engine: generation before and after is unchanged."""
    llm = LLM(str(tiny_llama_path), progress=False)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    before = llm.generate("the hen", params)[0].token_ids
    ids = llm.tokenize("the hen sat on")
    h = llm._decoder_states(ids, "mean")
    assert h.shape == (len(ids), llm.config.dim)
    mean = llm.embed("the hen sat on")
    np.testing.assert_allclose(mean, h.mean(0) / np.linalg.norm(h.mean(0)), atol=1e-6)
    last = llm.embed("the hen sat on", pooling="last")
    np.testing.assert_allclose(last, h[-1] / np.linalg.norm(h[-1]), atol=1e-5)
    # the hidden state is what the logits come from: the output matrix applied to it gives the same argmax
    assert llm.generate("the hen", params)[0].token_ids == before
    assert llm.stats()["kv_blocks_used"] == 0


def test_embed_command(tiny_nomic_path, tmp_path):
    f = tmp_path / "texts.txt"
    f.write_text("the dog ran\n\nthe cat sat\n")
    r = CliRunner().invoke(main, ["embed", str(tiny_nomic_path), "the hen", "--file", str(f), "--dimensions", "8"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["model"] == "tiny-nomic" and [d["index"] for d in data["data"]] == [0, 1, 2]
    assert all(len(d["embedding"]) == 8 for d in data["data"])
    assert data["usage"]["prompt_tokens"] == data["usage"]["total_tokens"] == 4 + 5 + 5
    r = CliRunner().invoke(main, ["embed", str(tiny_nomic_path)])
    assert r.exit_code != 0 and "at least one TEXT" in r.output
    r = CliRunner().invoke(main, ["embed", str(tiny_nomic_path), " ".join(["hen"] * 300)])
    assert r.exit_code == 1 and "context holds 128" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["generate", str(tiny_nomic_path), "the hen"])
    assert r.exit_code == 1 and "is an embedding model" in r.output
