"""`edgeinfer bench-serve`: load tests of any OpenAI-compatible server (ours, llama.cpp's llama-server,
vLLM, Ollama), the way `vllm bench serve` does.

A run is: build the requests of a workload (prompts cut from a bundled public-domain text to exact token
lengths), send a few warm-up requests that are not counted, then send the rest on an arrival process
(Poisson or gamma-bursty at a request rate, or all at once under a concurrency cap: closed loop), each
streamed over `/v1/completions` or `/v1/chat/completions`, and time every chunk. `summarize` turns the
per-request records into latency percentiles, throughput and goodput; the server's own `/metrics` are
scraped before, during and after, and their changes reported.

Definitions (as vLLM's benchmark):
- TTFT: from sending the request to the first chunk that carries text.
- TPOT: (end-to-end latency - TTFT) / (output tokens - 1), per request with more than one output token.
- ITL: the gaps between successive chunks that carry text (a chunk may hold several tokens).
- Output tokens: the server's `usage.completion_tokens` when it sends usage, else the text chunks.
- Percentiles: numpy's linear interpolation between closest ranks.
- Goodput: requests per second that finished within every SLO given (--slo-ttft-ms, --slo-tpot-ms).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from .errors import EdgeInferError

WORKLOADS = ("fixed", "mixed", "shared-prefix", "priority")
PERCENTILES = (50, 90, 95, 99)
# server metrics worth reporting: KV use, prefix caching, preemption, queueing (ours and llama.cpp's)
SERVER_METRIC = re.compile(r"kv|cache|preempt|prefix|hit|deferred|processing|running|waiting|swapped", re.I)


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


@dataclass
class RequestResult:
    label: str
    input_len: int
    start: float  # seconds from the start of the run
    ok: bool = False
    error: str | None = None  # the kind: http_503, timeout, connect, disconnected, stream_error, bad_response
    detail: str = ""
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    e2e: float | None = None
    output_tokens: int = 0
    prompt_tokens: int | None = None  # as the server reported in usage

    @property
    def tpot(self) -> float | None:
        if not self.ok or self.output_tokens < 2 or self.ttft is None:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


def bundled_text() -> str:
    return resources.files("edgeinfer").joinpath("data/botchan.txt").read_text(encoding="utf-8")


class LocalTokenizer:
    """Our tokenizer of a GGUF file, for servers without /tokenize (the same GGUF as the server's)."""

    def __init__(self, model: str):
        from . import registry
        from .gguf_file import GGUFFile
        from .tokenizer import Tokenizer

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


# -- one request -----------------------------------------------------------------------------------


def _chunk_text(obj: dict) -> str:
    choices = obj.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return ""
    c = choices[0]
    if isinstance(c.get("text"), str):
        return c["text"]
    delta = c.get("delta") or {}
    return (delta.get("content") or delta.get("reasoning_content") or "") if isinstance(delta, dict) else ""


async def send_request(client, url: str, body: dict, spec: RequestSpec, t_start: float, timeout: float) -> RequestResult:
    """Send one streamed request and time its chunks; never raises (failures are recorded by kind)."""
    import httpx

    res = RequestResult(label=spec.label, input_len=spec.input_len, start=time.perf_counter() - t_start)
    t0 = time.perf_counter()
    stamps: list[float] = []
    chunks = 0
    finished = done = False

    async def consume():
        nonlocal chunks, finished, done
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode("utf-8", "replace")
                res.error, res.detail = f"http_{r.status_code}", text[:300]
                return
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    done = True
                    break
                try:
                    obj = json.loads(payload)
                except json.JSONDecodeError:
                    res.error, res.detail = "bad_response", payload[:300]
                    return
                if not isinstance(obj, dict):
                    continue
                if "error" in obj:
                    res.error, res.detail = "stream_error", json.dumps(obj["error"])[:300]
                    return
                if _chunk_text(obj):
                    stamps.append(time.perf_counter())
                    chunks += 1
                for c in obj.get("choices") or []:
                    if isinstance(c, dict) and c.get("finish_reason"):
                        finished = True
                usage = obj.get("usage")
                if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
                    res.output_tokens = int(usage["completion_tokens"])
                    if usage.get("prompt_tokens") is not None:
                        res.prompt_tokens = int(usage["prompt_tokens"])

    try:
        await asyncio.wait_for(consume(), timeout)
    except (asyncio.TimeoutError, httpx.TimeoutException):
        res.error, res.detail = "timeout", f"no complete answer within {timeout:g} s"
    except httpx.ConnectError as e:
        res.error, res.detail = "connect", str(e)[:300]
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as e:
        res.error, res.detail = "disconnected", f"{type(e).__name__}: {e}"[:300]
    except httpx.HTTPError as e:
        res.error, res.detail = "http_error", f"{type(e).__name__}: {e}"[:300]
    end = time.perf_counter()
    if res.error is None and not (done or finished):
        res.error, res.detail = "disconnected", "the stream ended before its last chunk"
    if res.error is None and not stamps:
        res.error, res.detail = "empty", "the stream held no text"
    if res.error is None:
        res.ok = True
        res.ttft = stamps[0] - t0
        res.itl = [b - a for a, b in zip(stamps, stamps[1:])]
        res.e2e = end - t0
        if not res.output_tokens:
            res.output_tokens = chunks
    return res


# -- statistics ------------------------------------------------------------------------------------


def _stats(name: str, values_ms: list[float]) -> dict:
    if not values_ms:
        return {f"{name}_ms_mean": None, **{f"{name}_ms_p{p}": None for p in PERCENTILES}}
    a = np.asarray(values_ms, dtype=np.float64)
    out = {f"{name}_ms_mean": float(a.mean())}
    for p in PERCENTILES:
        out[f"{name}_ms_p{p}"] = float(np.percentile(a, p))
    return out


def _latencies(ok: list[RequestResult], itl: bool) -> dict:
    """TTFT, TPOT, (ITL,) and end-to-end statistics of completed requests, in ms."""
    out = {**_stats("ttft", [r.ttft * 1000 for r in ok]),
           **_stats("tpot", [r.tpot * 1000 for r in ok if r.tpot is not None])}
    if itl:
        out.update(_stats("itl", [g * 1000 for r in ok for g in r.itl]))
    out.update(_stats("e2e", [r.e2e * 1000 for r in ok]))
    return out


def meets_slo(r: RequestResult, slo_ttft_ms: float | None, slo_tpot_ms: float | None) -> bool:
    if not r.ok:
        return False
    if slo_ttft_ms is not None and r.ttft * 1000 > slo_ttft_ms:
        return False
    tpot = r.tpot
    return not (slo_tpot_ms is not None and tpot is not None and tpot * 1000 > slo_tpot_ms)


def summarize(results: list[RequestResult], duration: float, slo_ttft_ms: float | None = None,
              slo_tpot_ms: float | None = None) -> dict:
    """Every figure of a run from its request records; `duration` is the run's wall time in seconds."""
    ok = [r for r in results if r.ok]
    duration = max(duration, 1e-9)
    out = {
        "num_requests": len(results),
        "completed": len(ok),
        "errors": len(results) - len(ok),
        "errors_by_kind": dict(Counter(r.error for r in results if not r.ok)),
        "duration_s": duration,
        "total_input_tokens": sum(r.input_len for r in ok),
        "total_output_tokens": sum(r.output_tokens for r in ok),
        "request_throughput": len(ok) / duration,
        "output_tok_s": sum(r.output_tokens for r in ok) / duration,
        "total_tok_s": sum(r.output_tokens + r.input_len for r in ok) / duration,
    }
    out.update(_latencies(ok, itl=True))
    good = sum(meets_slo(r, slo_ttft_ms, slo_tpot_ms) for r in results)
    out["slo_ttft_ms"], out["slo_tpot_ms"] = slo_ttft_ms, slo_tpot_ms
    out["good_requests"] = good
    out["goodput"] = good / duration
    labels = sorted({r.label for r in results})
    if len(labels) > 1:  # the mixed and priority workloads: each kind of request on its own
        out["by_label"] = {}
        for lab in labels:
            rs = [r for r in results if r.label == lab]
            rok = [r for r in rs if r.ok]
            out["by_label"][lab] = {"requests": len(rs), "completed": len(rok), **_latencies(rok, itl=False)}
    return out


def rate_value(run: dict) -> float:
    """A run's request rate as a number: summaries write the infinite rate as "inf" (JSON has no inf)."""
    r = run["request_rate"]
    return math.inf if r == "inf" else float(r)


def goodput_knee(runs: list[dict], slo_ttft_ms: float = 2000.0, slo_tpot_ms: float = 100.0) -> float | None:
    """The highest swept request rate whose P99 TTFT and P99 TPOT stay under the limits, with no errors
    (math.inf when even the run that sends everything at once does)."""
    best = None
    for run in runs:
        ok = (run["errors"] == 0 and run["completed"] > 0 and run["ttft_ms_p99"] is not None
              and run["ttft_ms_p99"] < slo_ttft_ms and (run["tpot_ms_p99"] is None or run["tpot_ms_p99"] < slo_tpot_ms))
        if ok and (best is None or rate_value(run) > best):
            best = rate_value(run)
    return best


# -- server metrics --------------------------------------------------------------------------------


def parse_metrics(text: str) -> dict[str, tuple[str, float]]:
    """The interesting series of a Prometheus exposition: {series: (type, value)}."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    try:
        families = list(text_string_to_metric_families(text))
    except Exception:  # an exposition we cannot read is no reason to fail a benchmark
        return out
    for fam in families:
        if not SERVER_METRIC.search(fam.name):
            continue
        for s in fam.samples:
            if s.name.endswith(("_bucket", "_created")):
                continue
            key = s.name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items())) + "}" if s.labels else "")
            kind = "counter" if fam.type == "unknown" and s.name.endswith("_total") else fam.type
            out[key] = (kind, float(s.value))
    return out


class MetricsWatcher:
    """Scrapes /metrics before, every `interval` seconds during, and after a run."""

    def __init__(self, client, base_url: str, interval: float = 1.0):
        self.client, self.url, self.interval = client, base_url.rstrip("/") + "/metrics", interval
        self.first: dict | None = None
        self.peaks: dict[str, float] = {}
        self.last: dict = {}

    async def scrape(self) -> dict | None:
        try:
            r = await self.client.get(self.url, timeout=5)
        except Exception:
            return None
        if r.status_code != 200:
            return None
        m = parse_metrics(r.text)
        for k, (_, v) in m.items():
            self.peaks[k] = max(v, self.peaks.get(k, v))
        self.last = m
        return m

    async def watch(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.scrape()
            try:
                await asyncio.wait_for(stop.wait(), self.interval)
            except asyncio.TimeoutError:
                pass

    def report(self) -> dict:
        """Counters: change over the run; gauges: peak and last value."""
        if self.first is None or not self.last:
            return {}
        out = {}
        for k, (kind, v) in self.last.items():
            if kind == "counter":
                out[k] = {"delta": v - self.first.get(k, (kind, 0.0))[1]}
            elif kind == "gauge":
                out[k] = {"peak": self.peaks.get(k, v), "last": v}
        return out


# -- a run -----------------------------------------------------------------------------------------


@dataclass
class BenchConfig:
    base_url: str
    model: str | None = None
    endpoint: str = "completions"  # or "chat"
    workload: str = "fixed"
    num_prompts: int = 100
    request_rate: float = math.inf
    burstiness: float = 1.0
    concurrency: int | None = None
    input_len: int = 128
    output_len: int = 64
    prefix_len: int = 512
    long_fraction: float = 0.2
    priority_fraction: float = 0.2
    high_priority: int = -1  # what the priority workload's urgent requests send (lower runs first)
    seed: int = 0
    warmup: int = 2
    timeout: float = 300.0
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    temperature: float = 0.0
    ignore_eos: bool = True
    api_key: str | None = None
    tokenizer: str | None = None  # a model name or GGUF path for servers without /tokenize
    progress: bool = True

    def __post_init__(self):
        if self.endpoint not in ("completions", "chat"):
            raise BenchServeError(f"endpoint must be 'completions' or 'chat', got {self.endpoint!r}")
        if self.workload not in WORKLOADS:
            raise BenchServeError(f"unknown workload {self.workload!r}; choose from {', '.join(WORKLOADS)}")
        for name in ("num_prompts", "input_len", "output_len"):
            if getattr(self, name) < 1:
                raise BenchServeError(f"{name.replace('_', '-')} must be at least 1")
        if self.concurrency is not None and self.concurrency < 1:
            raise BenchServeError("concurrency must be at least 1")
        if not 0 <= self.long_fraction <= 1 or not 0 <= self.priority_fraction <= 1:
            raise BenchServeError("the long and priority fractions must be between 0 and 1")
        if self.timeout <= 0:
            raise BenchServeError("the timeout must be positive")


def parse_rates(text: str) -> list[float]:
    """'0.5,1,2,inf' -> [0.5, 1.0, 2.0, inf]; a clear error for anything else."""
    rates = []
    for part in text.split(","):
        part = part.strip().lower()
        try:
            r = math.inf if part in ("inf", "infinity") else float(part)
        except ValueError:
            raise BenchServeError(f"a request rate must be a number or 'inf', got {part!r}") from None
        if not r > 0 or math.isnan(r):
            raise BenchServeError(f"a request rate must be positive, got {part!r}")
        rates.append(r)
    if not rates:
        raise BenchServeError("no request rate given")
    return rates


class Bench:
    """One target server: its tokenizer and requests, prepared once, then any number of runs."""

    def __init__(self, config: BenchConfig):
        self.cfg = config
        self.base = config.base_url.rstrip("/")
        if self.base.endswith("/v1"):
            self.base = self.base[:-3]
        self.headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else None
        self.client = None
        self.cutter: PromptCutter | None = None
        self.server_info: dict = {}

    async def __aenter__(self):
        import httpx

        self.client = httpx.AsyncClient(timeout=httpx.Timeout(self.cfg.timeout, connect=10.0), headers=self.headers,
                                        limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
        return self

    async def __aexit__(self, *exc):
        await self.client.aclose()

    async def prepare(self) -> None:
        import httpx

        cfg = self.cfg
        try:
            r = await self.client.get(self.base + "/v1/models", timeout=10)
        except httpx.HTTPError as e:
            raise BenchServeError(f"cannot reach {self.base}: {type(e).__name__}: {e}") from None
        models = r.json().get("data") if r.status_code == 200 else None
        self.server_info["models"] = models
        if models and cfg.model is None:
            cfg.model = models[0].get("id")
        if cfg.tokenizer:
            tok = LocalTokenizer(cfg.tokenizer)
            self.server_info["tokenizer"] = f"local: {cfg.tokenizer}"
        else:
            tok = ServerTokenizer(self.client, self.base, cfg.model)
            try:
                await tok.encode("probe")
            except (BenchServeError, httpx.HTTPError, ValueError) as e:
                raise BenchServeError(f"the server has no usable /tokenize ({e}); pass --tokenizer with the "
                                      "same GGUF (a model name or path) to count prompt tokens locally") from None
            self.server_info["tokenizer"] = "server /tokenize"
        self.cutter = PromptCutter(tok)
        await self.cutter.prepare()

    async def requests(self, run_index: int) -> tuple[list[RequestSpec], list[RequestSpec]]:
        """The warm-up and counted requests of the run_index-th run of a sweep: new prompts for every run,
        so that no run finds the previous run's prompts in the server's prompt or prefix cache."""
        cfg = self.cfg
        kw = dict(input_len=cfg.input_len, output_len=cfg.output_len, cutter=self.cutter, prefix_len=cfg.prefix_len,
                  long_fraction=cfg.long_fraction, priority_fraction=cfg.priority_fraction,
                  high_priority=cfg.high_priority)
        seed = cfg.seed + 7919 * run_index
        specs = await build_requests(cfg.workload, cfg.num_prompts, seed=seed, **kw)
        warm = await build_requests("fixed", cfg.warmup, seed=seed + 1_000_003, **kw) if cfg.warmup else []
        return warm, specs

    def _url(self) -> str:
        return self.base + ("/v1/chat/completions" if self.cfg.endpoint == "chat" else "/v1/completions")

    def _body(self, spec: RequestSpec) -> dict:
        return request_body(spec, chat=self.cfg.endpoint == "chat", model=self.cfg.model,
                            temperature=self.cfg.temperature, ignore_eos=self.cfg.ignore_eos)

    async def run(self, rate: float, run_index: int = 0) -> tuple[dict, list[RequestResult]]:
        cfg = self.cfg
        url = self._url()
        warm, specs = await self.requests(run_index)
        for spec in warm:  # not counted: first-request costs (compilation, caches) stay out
            r = await send_request(self.client, url, self._body(spec), spec, time.perf_counter(), cfg.timeout)
            if not r.ok:
                raise BenchServeError(f"the warm-up request failed ({r.error}): {r.detail}")
        offsets = arrival_offsets(len(specs), rate, cfg.burstiness, cfg.seed + run_index)
        watcher = MetricsWatcher(self.client, self.base)
        watcher.first = await watcher.scrape()
        stop = asyncio.Event()
        watch_task = asyncio.create_task(watcher.watch(stop))
        sem = asyncio.Semaphore(cfg.concurrency) if cfg.concurrency else contextlib.nullcontext()
        bar = _progress(len(specs), cfg.progress, rate)
        results: list[RequestResult] = []
        done = {"tokens": 0, "errors": 0}  # running totals for the progress bar
        t_start = time.perf_counter()

        async def one(spec: RequestSpec, at: float) -> None:
            delay = at - (time.perf_counter() - t_start)
            if delay > 0:
                await asyncio.sleep(delay)
            async with sem:
                r = await send_request(self.client, url, self._body(spec), spec, t_start, cfg.timeout)
            results.append(r)
            if r.ok:
                done["tokens"] += r.output_tokens
            else:
                done["errors"] += 1
            if bar is not None:
                bar.set_postfix_str(f"{done['tokens'] / max(time.perf_counter() - t_start, 1e-9):.1f} out tok/s, "
                                    f"{done['errors']} errors", refresh=False)
                bar.update(1)

        try:
            await asyncio.gather(*(one(s, float(at)) for s, at in zip(specs, offsets)))
        finally:
            duration = time.perf_counter() - t_start
            stop.set()
            await watch_task
            if bar is not None:
                bar.close()
        await watcher.scrape()
        summary = summarize(results, duration, cfg.slo_ttft_ms, cfg.slo_tpot_ms)
        summary = {"request_rate": rate if math.isfinite(rate) else "inf", "burstiness": cfg.burstiness,
                   "concurrency": cfg.concurrency, **summary, "server_metrics": watcher.report()}
        return summary, results


def _progress(total: int, enabled: bool, rate: float):
    if not enabled:
        return None
    from tqdm import tqdm

    label = "rate inf" if math.isinf(rate) else f"rate {rate:g}/s"
    return tqdm(total=total, desc=label, unit="req", file=sys.stderr, dynamic_ncols=True, leave=False)


# -- output ----------------------------------------------------------------------------------------

TABLE_COLUMNS = [("rate", "request_rate", "{}"), ("done", "completed", "{}"), ("err", "errors", "{}"),
                 ("req/s", "request_throughput", "{:.2f}"), ("out tok/s", "output_tok_s", "{:.1f}"),
                 ("TTFT p50", "ttft_ms_p50", "{:.0f}"), ("TTFT p99", "ttft_ms_p99", "{:.0f}"),
                 ("TPOT p50", "tpot_ms_p50", "{:.1f}"), ("TPOT p99", "tpot_ms_p99", "{:.1f}"),
                 ("ITL p99", "itl_ms_p99", "{:.1f}"), ("E2E p99", "e2e_ms_p99", "{:.0f}"),
                 ("goodput", "goodput", "{:.2f}")]


def format_table(runs: list[dict], name_col: list[str] | None = None) -> str:
    """A fixed-width table: one row per run, latencies in ms."""
    head = (["server"] if name_col else []) + [c[0] for c in TABLE_COLUMNS]
    rows = []
    for i, run in enumerate(runs):
        cells = [name_col[i]] if name_col else []
        for _, key, fmt in TABLE_COLUMNS:
            v = run.get(key)
            cells.append("-" if v is None else fmt.format(v))
        rows.append(cells)
    widths = [max(len(h), *(len(r[j]) for r in rows)) if rows else len(h) for j, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def plot_sweep(curves: dict[str, list[dict]], path: Path, title: str = "") -> Path:
    """Latency against achieved output tokens/s: P50 and P99 TTFT and TPOT, one line per server."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    panels = [("ttft_ms_p50", "TTFT P50 (ms)"), ("ttft_ms_p99", "TTFT P99 (ms)"),
              ("tpot_ms_p50", "TPOT P50 (ms)"), ("tpot_ms_p99", "TPOT P99 (ms)")]
    for ax, (key, label) in zip(axes.flat, panels):
        for name, runs in curves.items():
            pts = [(r["output_tok_s"], r[key], r["request_rate"]) for r in runs if r.get(key) is not None]
            if not pts:
                continue
            xs, ys, rates = zip(*pts)
            ax.plot(xs, ys, marker="o", label=name)
            for x, y, rt in zip(xs, ys, rates):
                ax.annotate(f"{rt}/s" if rt != "inf" else "inf", (x, y), fontsize=7, xytext=(3, 3),
                            textcoords="offset points")
        ax.set_xlabel("achieved output tokens/s")
        ax.set_ylabel(label)
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title or "latency against throughput")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def result_record(cfg: BenchConfig, runs: list[dict], server_info: dict) -> dict:
    c = asdict(cfg)
    c.pop("api_key", None)
    c["request_rate"] = "inf" if math.isinf(c["request_rate"]) else c["request_rate"]
    return {"tool": "edgeinfer bench-serve", "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "config": c,
            "server": server_info, "runs": runs}


async def bench_serve(cfg: BenchConfig, rates: list[float]) -> tuple[list[dict], dict]:
    """Prepare once, then one run per rate; returns the runs' summaries and what we learned of the server."""
    async with Bench(cfg) as b:
        await b.prepare()
        runs = []
        for i, rate in enumerate(rates):
            summary, _ = await b.run(rate, i)
            runs.append(summary)
        return runs, b.server_info
