"""Fill in the middle: the FIM tokens, the infill prompt (llama.cpp's format_prompt_infill), `suffix` on
/v1/completions and llama.cpp's /infill through a real server, and Qwen2.5-Coder 0.5B against llama.cpp
(tests/golden/fim.json)."""

import json

import httpx
import pytest

from conftest import golden_path, real_model_path
from edgeinfer.gguf_file import GGUFFile
from edgeinfer.openai.fim import CHUNK_SEPARATOR, FimTokens, fim_tokens, infill_prompt
from edgeinfer.tokenizer import Tokenizer
from test_server import Server
from tiny_models import write_tiny_fim, write_tiny_llama

PRE, MID, SUF, PAD, REP, SEP = range(267, 273)  # write_tiny_fim's FIM tokens
GREEDY = {"temperature": 0, "seed": 1}


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("fim")
    write_tiny_fim(d / "tiny-fim.gguf", n_ctx=4096, seed=1)  # a seed whose fills are text
    write_tiny_llama(d / "tiny-plain.gguf", n_ctx=4096)
    write_tiny_llama(d / "tiny-fim3.gguf", n_ctx=4096,
                     extra_specials=("<fim_prefix>", "<fim_suffix>", "<fim_middle>"))  # Granite's names, no rep/sep
    return d


def _tok(path):
    gf = GGUFFile(path)
    return Tokenizer(gf), gf


@pytest.fixture(scope="module")
def fim_tok(paths):
    return _tok(paths / "tiny-fim.gguf")


# -- the FIM tokens ------------------------------------------------------------------------------


def test_fim_tokens_are_found_by_name(fim_tok, paths):
    tok, gf = fim_tok
    f = fim_tokens(tok, gf)
    assert (f.pre, f.suf, f.mid, f.pad, f.rep, f.sep) == (PRE, SUF, MID, PAD, REP, SEP)
    assert f.can_infill and f.missing == []
    # the file separator, repo and pad end a generation, with <|endoftext|> (0) and <|im_end|> (2)
    assert f.stop_ids == (0, 2, PAD, REP, SEP)
    granite = fim_tokens(*_tok(paths / "tiny-fim3.gguf"))
    assert (granite.pre, granite.suf, granite.mid, granite.rep, granite.sep) == (267, 268, 269, None, None)


def test_a_vocabulary_without_fim_tokens_cannot_infill(paths):
    tok, gf = _tok(paths / "tiny-plain.gguf")
    f = fim_tokens(tok, gf)
    assert not f.can_infill and f.missing == ["prefix", "suffix", "middle"]
    with pytest.raises(ValueError, match="no fill-in-the-middle tokens"):
        infill_prompt(tok, f, "a", "b", n_ctx=256)


def test_gguf_keys_win_over_names_and_deprecated_keys_over_new_ones(fim_tok):
    tok, _ = fim_tok
    meta = {"tokenizer.ggml.fim_pre_token_id": 100, "tokenizer.ggml.fim_sep_token_id": 101,
            "tokenizer.ggml.fim_mid_token_id": 102, "tokenizer.ggml.middle_token_id": 103,
            "tokenizer.ggml.fim_suf_token_id": 10 ** 6}  # outside the vocabulary: ignored
    f = fim_tokens(tok, meta)
    assert (f.pre, f.sep, f.mid, f.suf, f.rep) == (100, 101, 103, SUF, REP)


# -- the infill prompt (a stub tokenizer: one id per character) --------------------------------


class CharTokenizer:
    """Characters as their code points; "<S>" (parsed only when asked) is id 9000; BOS 1 when add_bos."""

    def __init__(self, add_bos=False):
        self.add_bos, self.bos_id = add_bos, 1

    def encode(self, text, add_bos=None, parse_special=False):
        ids, i = [], 0
        while i < len(text):
            if parse_special and text.startswith("<S>", i):
                ids.append(9000)
                i += 3
            else:
                ids.append(ord(text[i]))
                i += 1
        return ids


FULL = FimTokens(pre=-1, suf=-2, mid=-3, pad=-4, rep=-5, sep=-6)
C = CharTokenizer()


def enc(s):
    return [ord(c) for c in s]


def test_infill_prompt_is_repo_chunks_then_prefix_prompt_suffix_middle():
    extra = [{"filename": "a.py", "text": "x=1"}, {"filename": None, "text": "y"}]
    ids = infill_prompt(C, FULL, "def f(", "):", extra, "ab<S>", n_ctx=4096)
    assert ids == ([-5, *enc("myproject\n"), -6, *enc("a.py\n"), *enc("x=1"), -6, *enc("tmp\n"), *enc("y"),
                    -6, *enc("filename\n")]
                   + [-1, *enc("def f("), *enc("ab"), 9000, -2, *enc("):"), -3])


def test_infill_prompt_without_repo_tokens_joins_chunks_with_snippet_lines():
    three = FimTokens(pre=-1, suf=-2, mid=-3)
    ids = infill_prompt(C, three, "p", "s", [{"filename": "a", "text": "A"}, {"filename": "b", "text": "B"}],
                        n_ctx=4096)
    assert ids == [*enc(CHUNK_SEPARATOR), *enc("A"), *enc(CHUNK_SEPARATOR), *enc("B"), -1, *enc("p"), -2,
                   *enc("s"), -3]


def test_infill_prompt_bos_goes_after_the_extra_context_and_spm_swaps_the_parts():
    ids = infill_prompt(CharTokenizer(add_bos=True), FimTokens(pre=-1, suf=-2, mid=-3), "p", "s",
                        [{"filename": "f", "text": "T"}], "q", n_ctx=4096, spm=True)
    assert ids == [*enc(CHUNK_SEPARATOR), *enc("T"), 1, -2, *enc("s"), -1, *enc("p"), *enc("q"), -3]


def test_infill_prompt_truncates_as_llama_cpp():
    prefix, suffix = "".join(chr(0x4E00 + i) for i in range(3000)), "".join(chr(0x5E00 + i) for i in range(3000))
    # a batch of 2048: the prefix keeps its last 1536 tokens, the suffix its first 512 - 2 - len(prompt)
    ids = infill_prompt(C, FimTokens(pre=-1, suf=-2, mid=-3), prefix, suffix, prompt="ab", n_ctx=8192)
    assert ids == [-1, *enc(prefix[-1536:]), *enc("ab"), -2, *enc(suffix[:508]), -3]
    # the batch is clamped to the context: 3/4 and 1/4 of 256
    ids = infill_prompt(C, FimTokens(pre=-1, suf=-2, mid=-3), prefix, suffix, n_ctx=256)
    assert ids == [-1, *enc(prefix[-192:]), -2, *enc(suffix[:62]), -3]


def test_infill_prompt_keeps_the_end_of_the_extra_context_that_fits():
    extra = [{"filename": "big", "text": "z" * 5000}]
    three = FimTokens(pre=-1, suf=-2, mid=-3)
    # n_ctx - n_batch - 2 n_predict = 4096 - 2048 - 200 tokens of extra context, its last ones
    ids = infill_prompt(C, three, "p", "s", extra, n_ctx=4096, n_predict=100)
    assert ids == [*enc("z" * 1848), -1, *enc("p"), -2, *enc("s"), -3]
    # n_predict -1 (llama-server's default) takes n_ctx - n_batch + 2 (2 when the batch is the context)
    assert len(infill_prompt(C, three, "p", "s", extra, n_ctx=4096)) == 2050 + 5
    assert infill_prompt(C, three, "p", "s", extra, n_ctx=1024) == [*enc("zz"), -1, *enc("p"), -2, *enc("s"), -3]


def test_infill_prompt_leaves_room_to_generate():
    # llama.cpp would take 2054 tokens of extra context before the 49 of the rest: 2103 in a context of 2100
    ids = infill_prompt(C, FimTokens(pre=-1, suf=-2, mid=-3), "p" * 40, "s" * 20, [{"text": "z" * 5000}],
                        n_ctx=2100, n_batch=48)
    assert len(ids) == 2099 and ids[-49:] == [-1, *enc("p" * 36), -2, *enc("s" * 10), -3]


# -- through the server --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(paths):
    s = Server(paths / "tiny-fim.gguf", paths / "tiny-plain.gguf").wait_ready(timeout=120)
    yield s
    s.stop()


def post(server, path, body):
    return httpx.post(server.base + path, json=body, timeout=60)


def events(server, path, body):
    with httpx.Client(timeout=60) as h, h.stream("POST", server.base + path, json=body) as r:
        assert r.status_code == 200, r.read()
        return [line[6:] for line in r.iter_lines() if line.startswith("data: ")]


def tokenize(server, text, model="tiny-fim"):
    return post(server, "/tokenize", {"content": text, "model": model}).json()["tokens"]


def header(server):
    return 1 + len(tokenize(server, "myproject\n")) + 1 + len(tokenize(server, "filename\n"))


def test_completion_suffix_fills_in_the_middle(server):
    body = {"model": "tiny-fim", "prompt": "the", "suffix": "on", "max_tokens": 8, **GREEDY}
    r = post(server, "/v1/completions", body)
    assert r.status_code == 200, r.text
    out = r.json()
    # /infill's prompt with no input_extra: <|repo_name|>myproject\n<|file_sep|>filename\n, then
    # <|fim_prefix|>prompt<|fim_suffix|>suffix<|fim_middle|>
    n = header(server) + len(tokenize(server, "the")) + len(tokenize(server, "on")) + 3
    assert out["usage"]["prompt_tokens"] == n
    plain = post(server, "/v1/completions", {**body, "suffix": None}).json()
    assert plain["usage"]["prompt_tokens"] == len(tokenize(server, "the"))
    # the same model continues a different prompt differently, and the stream agrees with the whole answer
    chunks = events(server, "/v1/completions", {**body, "stream": True})
    assert chunks[-1] == "[DONE]"
    text = "".join(json.loads(c)["choices"][0]["text"] for c in chunks[:-1])
    assert text == out["choices"][0]["text"] != ""
    assert text != plain["choices"][0]["text"]  # the suffix changed what came
    ids_prompt = post(server, "/v1/completions", {**body, "prompt": tokenize(server, "the")}).json()
    assert ids_prompt["choices"][0]["text"] == out["choices"][0]["text"]


def test_infill_matches_the_completion_with_suffix(server):
    body = {"model": "tiny-fim", "input_prefix": "the", "input_suffix": "on", "n_predict": 8, **GREEDY}
    r = post(server, "/infill", body)
    assert r.status_code == 200, r.text
    out = r.json()
    comp = post(server, "/v1/completions", {"model": "tiny-fim", "prompt": "the", "suffix": "on",
                                             "max_tokens": 8, **GREEDY}).json()
    # the same prompt, so the same greedy fill
    assert out["tokens_evaluated"] == comp["usage"]["prompt_tokens"]
    assert out["content"] == comp["choices"][0]["text"]
    assert out["tokens_predicted"] == comp["usage"]["completion_tokens"]
    assert out["stop"] is True and out["stop_type"] in ("eos", "limit") and out["model"] == "tiny-fim"
    assert out["tokens"] == [] and set(out["timings"]) >= {"prompt_n", "predicted_n", "predicted_ms"}
    assert out["timings"]["predicted_n"] == out["tokens_predicted"]
    with_tokens = post(server, "/infill", {**body, "return_tokens": True}).json()
    assert with_tokens["content"] == out["content"] and len(with_tokens["tokens"]) == out["tokens_predicted"]


def test_infill_streams_llama_cpp_events(server):
    body = {"model": "tiny-fim", "input_prefix": "the", "input_suffix": "on", "n_predict": 10,
            "ignore_eos": True, **GREEDY}
    whole = post(server, "/infill", body).json()
    lines = events(server, "/infill", {**body, "stream": True})
    chunks = [json.loads(c) for c in lines]  # every event is JSON: no [DONE]
    assert all(c["stop"] is False for c in chunks[:-1]) and chunks[-1]["stop"] is True
    assert "".join(c["content"] for c in chunks) == whole["content"] != ""
    assert len(chunks) > 2 and chunks[-1]["content"] == ""  # pieces as they came; the last carries none
    assert chunks[-1]["stop_type"] == "limit" and chunks[-1]["tokens_predicted"] == 10


def test_infill_puts_input_extra_and_prompt_in(server):
    base = {"model": "tiny-fim", "input_prefix": "the", "input_suffix": "on", "n_predict": 1, **GREEDY}
    plain = post(server, "/infill", base).json()["tokens_evaluated"]
    extra = [{"filename": "a.txt", "text": "the cat sat", "time": 12.5}, {"text": "dog"}]
    with_extra = post(server, "/infill", {**base, "input_extra": extra, "prompt": "<|fim_pad|>"}).json()
    n_extra = sum(1 + len(tokenize(server, name + "\n")) + len(tokenize(server, text))
                  for name, text in (("a.txt", "the cat sat"), ("tmp", "dog")))
    assert with_extra["tokens_evaluated"] == plain + n_extra + 1  # the prompt's special token is one token


@pytest.mark.parametrize("token", [PAD, REP, SEP])
def test_fim_generations_end_at_the_file_separator_repo_and_pad_tokens(server, token):
    bias = {"logit_bias": {str(token): 100}, "ignore_eos": False}
    r = post(server, "/v1/completions", {"model": "tiny-fim", "prompt": "the", "suffix": "on", "max_tokens": 6,
                                         **bias, **GREEDY}).json()
    assert r["choices"][0]["finish_reason"] == "stop" and r["usage"]["completion_tokens"] == 1
    assert r["choices"][0]["text"] == ""
    r = post(server, "/infill", {"model": "tiny-fim", "input_prefix": "the", "input_suffix": "on", "n_predict": 6,
                                 **bias, **GREEDY}).json()
    assert (r["stop_type"], r["tokens_predicted"], r["content"]) == ("eos", 1, "")
    # a plain completion does not stop there: those tokens end only a fill
    r = post(server, "/v1/completions", {"model": "tiny-fim", "prompt": "the", "max_tokens": 6, **bias,
                                         **GREEDY}).json()
    assert r["choices"][0]["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 6


def test_a_model_without_fim_tokens_gives_a_400(server):
    r = post(server, "/infill", {"model": "tiny-plain", "input_prefix": "a", "input_suffix": "b"})
    assert r.status_code == 400 and "no fill-in-the-middle tokens" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "model"
    r = post(server, "/v1/completions", {"model": "tiny-plain", "prompt": "a", "suffix": "b"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
    assert "no fill-in-the-middle tokens" in r.json()["error"]["message"]
    # an empty suffix asks for nothing after the completion: a plain completion there
    r = post(server, "/v1/completions", {"model": "tiny-plain", "prompt": "a", "suffix": "", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(tokenize(server, "a", "tiny-plain"))


@pytest.mark.parametrize("body,param", [
    ({"input_suffix": "b"}, "input_prefix"),
    ({"input_prefix": "a"}, "input_suffix"),
    ({"input_prefix": 3, "input_suffix": "b"}, "input_prefix"),
    ({"input_prefix": "a", "input_suffix": "b", "input_extra": {"text": "x"}}, "input_extra"),
    ({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"filename": "f"}]}, "input_extra[0].text"),
    ({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"text": "x", "mode": 1}]}, "input_extra[0].mode"),
    ({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"text": "x", "filename": 2}]},
     "input_extra[0].filename"),
    ({"input_prefix": "a", "input_suffix": "b", "n_predict": 0}, "n_predict"),
    ({"input_prefix": "a", "input_suffix": "b", "temperature": "hot"}, "temperature"),
    ({"input_prefix": "a", "input_suffix": "b", "mirostat": 2}, "mirostat"),
    ({"input_prefix": "a", "input_suffix": "b", "prompt": ["x"]}, "prompt"),
])
def test_bad_infill_bodies_are_400s_naming_the_field(server, body, param):
    r = post(server, "/infill", {"model": "tiny-fim", **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_bad_suffixes_are_400s(server):
    r = post(server, "/v1/completions", {"model": "tiny-fim", "prompt": "a", "suffix": 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
    r = post(server, "/v1/completions", {"model": "tiny-fim", "prompt": [99999], "suffix": "b"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_llama_vscode_request_is_accepted(server):
    body = {"input_prefix": "the hen\n", "input_suffix": "\n", "input_extra": [], "prompt": "", "n_predict": 4,
            "top_k": 40, "top_p": 0.99, "stream": False, "samplers": ["top_k", "top_p", "infill"],
            "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 1000, "n_indent": 4,
            "response_fields": ["content"], "model": "tiny-fim"}
    r = post(server, "/infill", body)
    assert r.status_code == 200, r.text
    assert isinstance(r.json()["content"], str)


def test_openapi_documents_infill(server):
    doc = httpx.get(server.base + "/openapi.json").json()
    schema = doc["paths"]["/infill"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"input_prefix", "input_suffix", "input_extra", "n_predict"} <= set(schema["properties"])


# -- Qwen2.5-Coder 0.5B against llama.cpp ------------------------------------------------------------


TIE_MARGIN = 0.25  # as tests/test_golden.py: greedy picks are compared up to the first near-tie


@pytest.fixture(scope="module")
def qwen():
    real_model_path("qwen2.5-coder-0.5b-instruct")
    from edgeinfer import LLM

    with open(golden_path("fim.json")) as f:
        gold = json.load(f)
    return LLM("qwen2.5-coder-0.5b-instruct", progress=False), gold


@pytest.mark.model
def test_qwen_fim_tokens_and_infill_prompts_match_llama_cpp(qwen):
    from edgeinfer.openai.fim import llm_fim_tokens

    llm, gold = qwen
    f = llm_fim_tokens(llm)
    assert {k: getattr(f, k) for k in gold["fim_tokens"]} == gold["fim_tokens"]
    for c in gold["cases"]:
        ids = infill_prompt(llm.tokenizer, f, c["input_prefix"], c["input_suffix"], c["input_extra"], c["prompt"],
                            n_ctx=gold["n_ctx"], n_batch=gold["n_batch"], n_predict=gold["n_predict"])
        assert ids == c["prompt_ids"], c["name"]


@pytest.mark.model
def test_qwen_infill_greedy_matches_llama_cpp(qwen):
    from edgeinfer import SamplingParams

    llm, gold = qwen
    cases = gold["cases"]
    outs = llm.generate([c["prompt_ids"] for c in cases],
                        SamplingParams(temperature=0, max_tokens=max(len(c["output_ids"]) for c in cases), logprobs=2))
    compared = possible = 0
    for c, out in zip(cases, outs):
        possible += next((i for i, m in enumerate(c["top1_top2_margins"]) if m < TIE_MARGIN), len(c["output_ids"]))
        for step, want in enumerate(c["output_ids"]):
            ours_margin = out.logprobs[step]["top"][0][1] - out.logprobs[step]["top"][1][1]
            if c["top1_top2_margins"][step] < TIE_MARGIN or ours_margin < TIE_MARGIN:
                break
            assert out.token_ids[step] == want, (c["name"], step)
            compared += 1
    assert compared >= 0.4 * possible > 0, (compared, possible)
