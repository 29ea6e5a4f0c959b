"""`edgeinfer bench-serve`: load tests of any OpenAI-compatible server (ours, llama.cpp's llama-server,
vLLM, Ollama), the way `vllm bench serve` does.

A run is: wait for the server's /health to say it is ready (a server still loading its model answers
503), build the requests of a workload (prompts cut from a bundled public-domain text to exact token
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

The parts: config.py holds what a run is asked to do, workload.py builds the requests and when they
are sent, client.py sends them and scrapes /metrics, report.py turns the records into figures, tables
and charts; this module runs the whole, and its namespace holds the names of all five (`from
edgeinfer.bench import serve as bs`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
import time

from .client import SERVER_METRIC, MetricsWatcher, RequestResult, parse_metrics, send_request, wait_until_ready
from .config import BenchConfig
from .report import (PERCENTILES, TABLE_COLUMNS, format_table, goodput_knee, meets_slo, plot_sweep, rate_value,
                     result_record, summarize)
from .workload import (WORKLOADS, BenchServeError, LocalTokenizer, PromptCutter, RequestSpec, ServerTokenizer,
                       arrival_offsets, build_requests, bundled_text, request_body)

__all__ = ["PERCENTILES", "SERVER_METRIC", "TABLE_COLUMNS", "WORKLOADS", "Bench", "BenchConfig", "BenchServeError",
           "LocalTokenizer", "MetricsWatcher", "PromptCutter", "RequestResult", "RequestSpec", "ServerTokenizer",
           "arrival_offsets", "bench_serve", "build_requests", "bundled_text", "format_table", "goodput_knee",
           "meets_slo", "parse_metrics", "parse_rates", "plot_sweep", "rate_value", "request_body", "result_record",
           "send_request", "summarize", "wait_until_ready"]


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
        health = await wait_until_ready(self.client, self.base, cfg.wait)
        if health is not None:
            self.server_info["health"] = health
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


async def bench_serve(cfg: BenchConfig, rates: list[float]) -> tuple[list[dict], dict]:
    """Prepare once, then one run per rate; returns the runs' summaries and what we learned of the server."""
    async with Bench(cfg) as b:
        await b.prepare()
        runs = []
        for i, rate in enumerate(rates):
            summary, _ = await b.run(rate, i)
            runs.append(summary)
        return runs, b.server_info
