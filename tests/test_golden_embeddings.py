"""nomic-embed-text-v1.5 against llama.cpp's own embeddings of the same texts (tests/golden, made by
benchmarks/make_embed_golden.py): the same tokens, and vectors with cosine similarity >= 0.999."""

import json

import numpy as np
import pytest

from conftest import golden_path, real_model_path
from edgeinfer import LLM

pytestmark = pytest.mark.model

REF = json.load(open(golden_path("nomic-embed-text-v1.5-embeddings.json")))


@pytest.fixture(scope="module")
def nomic():
    return LLM(str(real_model_path("nomic-embed-text-v1.5")), progress=False)


def test_tokens_match_llama_cpp(nomic):
    for c in REF["cases"]:
        assert nomic.tokenize(c["text"], add_bos=None) == c["ids"], c["text"]


def test_vectors_match_llama_cpp(nomic):
    got = nomic.embed([c["text"] for c in REF["cases"]])
    for c, v in zip(REF["cases"], got):
        ref = np.asarray(c["embedding"], np.float32)
        cos = float(v @ ref / np.linalg.norm(ref))
        assert cos >= 0.999, (c["text"][:40], cos)
    # one at a time gives the same vectors as the batch
    np.testing.assert_allclose(nomic.embed(REF["cases"][0]["text"]), got[0], atol=1e-5)


def test_matryoshka_dimensions(nomic):
    texts = [c["text"] for c in REF["cases"][:3]]
    full = nomic.embed(texts, normalize=False)
    for d in (64, 256, 512):
        short = nomic.embed(texts, dimensions=d)
        want = full[:, :d] / np.linalg.norm(full[:, :d], axis=1, keepdims=True)
        np.testing.assert_allclose(short, want, atol=1e-5)
    # a query is still nearest its own document at 256 dimensions
    q = nomic.embed(["search_query: What is a KV cache?"], dimensions=256)
    d = nomic.embed(["search_document: " + t for t in ("The key-value cache stores attention keys and values.",
                                                      "Bread is baked from flour, water, salt and yeast.")],
                    dimensions=256)
    assert (q @ d.T)[0, 0] > (q @ d.T)[0, 1]
