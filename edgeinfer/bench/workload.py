"""The requests of a bench-serve run: prompts of exact token lengths cut from a bundled public-domain text
(counted by the server's /tokenize or by our tokenizer of the same GGUF), the workloads' mixes of
lengths, shared prefixes and priorities, the request bodies, and when each request is sent."""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources

import numpy as np

from ..errors import EdgeInferError

WORKLOADS = ("fixed", "mixed", "shared-prefix", "priority")


class BenchServeError(EdgeInferError):
    pass


# -- requests --------------------------------------------------------------------------------------


@dataclass
class RequestSpec:
    input_len: int  # prompt tokens as the target's tokenizer counts them (the text, without template or BOS)
    output_len: int
    prompt: str = ""  # completions; for chat, the user message
    system: str | None = None  # chat only: the shared prefix of the shared-prefix workload
    priority: int | None = None  # sent only when set (servers that do not take it would reject 0 too)
    label: str = "all"


def bundled_text() -> str:
    return resources.files("edgeinfer").joinpath("data/botchan.txt").read_text(encoding="utf-8")


class LocalTokenizer:
    """Our tokenizer of a GGUF file, for servers without /tokenize (the same GGUF as the server's)."""

    def __init__(self, model: str):
        from .. import registry
        from ..gguf_file import GGUFFile
        from ..tokenizer import Tokenizer

        with GGUFFile(registry.resolve(model, pull_missing=False)) as gf:
            self.tok = Tokenizer(gf)

    async def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_bos=False)

    async def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids)


class ServerTokenizer:
    """The target's own tokenizer through /tokenize and /detokenize (llama.cpp's, vLLM's and ours)."""

    def __init__(self, client, base_url: str, model: str | None):
        self.client, self.base, self.model = client, base_url.rstrip("/"), model

    async def _post(self, path: str, body: dict) -> dict:
        if self.model:
            body = {"model": self.model, **body}
        r = await self.client.post(self.base + path, json=body)
        if r.status_code != 200:
            raise BenchServeError(f"{path} answered HTTP {r.status_code}: {r.text[:200]}")
        return r.json()

    async def encode(self, text: str) -> list[int]:
        out = await self._post("/tokenize", {"content": text, "prompt": text, "add_special": False,
                                             "add_special_tokens": False})
        ids = out.get("tokens")
        if not isinstance(ids, list):
            raise BenchServeError(f"/tokenize gave no 'tokens': {str(out)[:200]}")
        return [t["id"] if isinstance(t, dict) else t for t in ids]

    async def decode(self, ids: list[int]) -> str:
        out = await self._post("/detokenize", {"tokens": ids})
        text = out.get("content", out.get("prompt"))
        if not isinstance(text, str):
            raise BenchServeError(f"/detokenize gave no text: {str(out)[:200]}")
        return text


class PromptCutter:
    """Cuts prompts of an exact token length out of the bundled text: a slice of its token ids, turned
    back into text and re-counted; the slice is widened or narrowed until the count matches (a slice's
    ends can merge with their neighbours when re-tokenized)."""

    def __init__(self, tokenizer, text: str | None = None):
        self.tokenizer = tokenizer
        self.text = text if text is not None else bundled_text()
        self.ids: list[int] = []

    async def prepare(self) -> None:
        self.ids = await self.tokenizer.encode(self.text)

    async def cut(self, length: int, rng: np.random.Generator) -> tuple[str, int]:
        if length + 8 > len(self.ids):
            raise BenchServeError(f"a prompt of {length} tokens is longer than the bundled text "
                                  f"({len(self.ids)} tokens)")
        start = int(rng.integers(0, len(self.ids) - length - 8))
        n, best = length, None
        for _ in range(6):
            text = await self.tokenizer.decode(self.ids[start:start + n])
            got = len(await self.tokenizer.encode(text))
            if best is None or abs(got - length) < abs(best[1] - length):
                best = (text, got)
            if got == length:
                break
            n = max(1, n + (length - got))
        return best


async def build_requests(workload: str, num: int, *, input_len: int, output_len: int, seed: int, cutter: PromptCutter,
                         prefix_len: int = 512, long_fraction: float = 0.2, priority_fraction: float = 0.2,
                         high_priority: int = -1) -> list[RequestSpec]:
    """The requests of a run, the same for the same seed and tokenizer."""
    if workload not in WORKLOADS:
        raise BenchServeError(f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")
    rng = np.random.default_rng(seed)
    specs = []
    prefix = None
    if workload == "shared-prefix":
        prefix, _ = await cutter.cut(prefix_len, rng)
    for i in range(num):
        n_in, n_out, label, priority = input_len, output_len, "all", None
        if workload == "mixed":
            if rng.random() < long_fraction:
                label = "long"
                n_in = int(rng.integers(2 * input_len, 4 * input_len + 1))
                n_out = int(rng.integers(output_len, 2 * output_len + 1))
            else:
                label = "short"
                n_in = int(rng.integers(max(1, input_len // 2), input_len + 1))
                n_out = int(rng.integers(max(1, output_len // 2), output_len + 1))
        elif workload == "priority":
            if rng.random() < priority_fraction:
                label, priority = "high", high_priority
            else:
                label = "normal"
        text, got = await cutter.cut(n_in, rng)
        spec = RequestSpec(input_len=got, output_len=n_out, prompt=text, priority=priority, label=label)
        if prefix is not None:
            spec.system, spec.label, spec.input_len = prefix, "shared-prefix", got + prefix_len
        specs.append(spec)
    return specs


def request_body(spec: RequestSpec, *, chat: bool, model: str | None, temperature: float, ignore_eos: bool) -> dict:
    body: dict = {"max_tokens": spec.output_len, "stream": True, "stream_options": {"include_usage": True},
                  "temperature": temperature}
    if model:
        body["model"] = model
    if ignore_eos:
        body["ignore_eos"] = True  # an extension ours, llama.cpp's and vLLM's take: exact output lengths
    if spec.priority is not None:
        body["priority"] = spec.priority
    if chat:
        msgs = [{"role": "system", "content": spec.system}] if spec.system is not None else []
        body["messages"] = msgs + [{"role": "user", "content": spec.prompt}]
    else:
        body["prompt"] = spec.prompt if spec.system is None else spec.system + "\n\n" + spec.prompt
    return body


# -- arrivals --------------------------------------------------------------------------------------


def arrival_offsets(num: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """When each request is sent, in seconds from the first. Gaps are gamma-distributed with shape
    `burstiness` and mean 1/rate: burstiness 1 is a Poisson process, below 1 burstier, above 1 steadier.
    rate inf: every request at once (with --concurrency: a closed loop)."""
    if rate <= 0 or burstiness <= 0:
        raise BenchServeError("the request rate and the burstiness must be positive")
    if math.isinf(rate) or num == 0:
        return np.zeros(num)
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=num - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])
