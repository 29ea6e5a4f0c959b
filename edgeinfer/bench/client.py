"""bench-serve's measuring client: the server waited for until its /health says it is ready, one streamed
request sent and every chunk of its answer timed, and the server's Prometheus /metrics scraped before,
during and after a run."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from dataclasses import dataclass, field

from .workload import BenchServeError, RequestSpec

# server metrics worth reporting: KV use, prefix caching, preemption, queueing (ours and llama.cpp's)
SERVER_METRIC = re.compile(r"kv|cache|preempt|prefix|hit|deferred|processing|running|waiting|swapped", re.I)


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


# -- readiness -------------------------------------------------------------------------------------


def _loading_names(body) -> str:
    """What a 503 /health says is loading: our server's model names, or llama.cpp's message."""
    if isinstance(body, dict):
        names = body.get("loading")
        if isinstance(names, list) and names:
            return ("model " if len(names) == 1 else "models ") + ", ".join(str(n) for n in names)
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    return "its model"


def _health_errors(r) -> str:
    """The errors a failed /health reports (ours: {"errors": {model: message}}), else its text."""
    try:
        body = r.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        errors = body.get("errors")
        if isinstance(errors, dict) and errors:
            return "; ".join(f"{k}: {v}" for k, v in errors.items())
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    return " ".join(r.text.split())[:300] or f"HTTP {r.status_code}"


async def wait_until_ready(client, base_url: str, wait: float, notify=None, interval: float = 0.5) -> dict | None:
    """Poll GET /health until the server says it is ready (200), for at most `wait` seconds, so that a
    server still loading its model is waited for rather than taken for one without /tokenize.

    A server that is loading answers 503 (ours and llama.cpp's); `notify` (default: a line on stderr)
    is told once what it is loading. Nothing listening fails at once, and so does a /health that reports
    failed loads (500), with the server's errors. A server without /health (404, 405: Ollama's) is taken
    as ready. Returns the /health body when it had one."""
    import httpx

    base = base_url.rstrip("/")
    notify = notify or (lambda line: print(line, file=sys.stderr, flush=True))
    deadline = time.monotonic() + wait
    told = False
    last = "no answer"
    while True:
        try:
            r = await client.get(base + "/health", timeout=max(1.0, min(10.0, wait)))
        except httpx.ConnectError as e:
            raise BenchServeError(f"cannot reach {base}: nothing listens there ({e})") from None
        except httpx.TimeoutException:
            r, last = None, "/health did not answer in time"
        except httpx.HTTPError as e:
            r, last = None, f"{type(e).__name__}: {e}"
        if r is not None:
            if r.status_code == 200:
                try:
                    body = r.json()
                except ValueError:
                    return None
                return body if isinstance(body, dict) else None
            if r.status_code in (404, 405, 501):  # no /health here: nothing to wait for
                return None
            if r.status_code == 500:
                raise BenchServeError(f"the server at {base} failed to load: {_health_errors(r)}")
            try:
                body = r.json()
            except ValueError:
                body = None
            last = f"still loading {_loading_names(body)}" if r.status_code == 503 else \
                f"/health answered HTTP {r.status_code}"
            if not told and wait > 0:
                notify(f"{base} is {last}; waiting up to {wait:g} s for it to be ready (--wait)")
                told = True
        left = deadline - time.monotonic()
        if left <= 0:
            raise BenchServeError(f"the server at {base} is not ready after {wait:g} s (--wait): {last}")
        await asyncio.sleep(min(interval, left))


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
