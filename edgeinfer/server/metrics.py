"""Prometheus metrics: request and token counters, latency histograms, and engine and model gauges read at
scrape (models come and go: each scrape reads the models in memory then)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


def _per_model(name: str, doc: str) -> CounterMetricFamily:
    """A counter read from each model's engine at scrape, labelled by model."""
    return CounterMetricFamily(f"edgeinfer_{name}", doc, labels=["model"])


class _EngineCollector:
    def __init__(self, served, budget: int = 0):
        self.served = served  # name -> ServedModel, the server's live table (server.models)
        self.budget = budget

    def collect(self):
        g = {name: GaugeMetricFamily(f"edgeinfer_{name}", doc, labels=["model"]) for name, doc in (
            ("running_sequences", "Sequences being computed"),
            ("waiting_sequences", "Requests waiting for a slot"),
            ("kv_blocks_used", "KV cache blocks in use"),
            ("kv_blocks_total", "KV cache blocks in all"),
            ("kv_blocks_cached", "Full blocks registered for prefix reuse"),
            ("prefix_cache_hit_rate", "Fraction of full prompt blocks found in the prefix cache"),
            ("kv_bytes", "Memory of the attention layers' KV pools (the window pool's included)"),
            ("window_blocks_used", "Window-pool blocks in use (sliding-window layers; gemma2, gemma3)"),
            ("window_blocks_total", "Window-pool blocks in all (0 for a model without sliding-window layers)"),
            ("window_bytes", "Memory of the sliding-window layers' KV pool"),
            ("state_slots_used", "Slots of recurrent state held by running sequences (hybrid models)"),
            ("state_slots_total", "Slots of recurrent state in all (hybrid models; 0 for others)"),
            ("state_bytes", "Memory of the recurrent layers' state, every slot (hybrid models)"),
        )}
        preempt = _per_model("preemptions", "Sequences preempted (to be recomputed)")
        queries = _per_model("prefix_cache_queries", "Full prompt blocks looked up in the prefix cache")
        hits = _per_model("prefix_cache_hits", "Full prompt blocks found in the prefix cache")
        compiles = _per_model("grammar_compiles", "Structured-output constraints compiled (grammar-cache misses)")
        reuses = _per_model("grammar_cache_hits", "Constraints found already compiled")
        compile_s = _per_model("grammar_compile_seconds", "Time spent compiling constraints")
        proposed = _per_model("spec_proposed_tokens", "Speculative decoding: tokens proposed (by the draft model or "
                              "prompt lookup) and verified")
        accepted = _per_model("spec_accepted_tokens", "Speculative decoding: proposed tokens the model accepted")
        rate = GaugeMetricFamily("edgeinfer_spec_acceptance_rate", "Speculative decoding: accepted / proposed "
                                 "tokens since start", labels=["model"])
        disk = {key: _per_model(key, doc) for key, doc in (
            ("prompt_cache_hits", "--prompt-cache: blocks read from disk into the prefix cache"),
            ("prompt_cache_misses", "--prompt-cache: prompts whose next block past the in-memory prefix hit was not "
                                    "on disk (or was refused)"),
            ("prompt_cache_damaged", "--prompt-cache: entries found damaged, truncated or foreign, and removed"),
            ("prompt_cache_write_errors", "--prompt-cache: blocks a write failed for (a full or read-only disk)"),
            ("prompt_cache_written_bytes", "--prompt-cache: bytes written to disk"),
            ("prompt_cache_read_bytes", "--prompt-cache: bytes read from disk"))}
        disk_bytes = GaugeMetricFamily("edgeinfer_prompt_cache_bytes", "--prompt-cache: bytes on disk",
                                       labels=["model"])
        loaded = [sm for sm in list(self.served.values()) if getattr(sm, "status", "loaded") == "loaded"]
        n_loaded = GaugeMetricFamily("edgeinfer_models_loaded", "Models in memory, ready to serve")
        n_loaded.add_metric([], len(loaded))
        model_bytes = GaugeMetricFamily("edgeinfer_model_memory_bytes", "A loaded model's estimated memory: "
                                        "weights, step buffers and KV pool", labels=["model"])
        for sm in loaded:
            model_bytes.add_metric([sm.name], getattr(sm, "size", 0))
        extra = [n_loaded, model_bytes]
        if self.budget:
            budget = GaugeMetricFamily("edgeinfer_memory_budget_bytes", "--memory-budget: the runtime and the "
                                       "loaded models together fit it")
            budget.add_metric([], self.budget)
            extra.append(budget)
        for sm in loaded:
            llm = sm.llm  # read once: an unload drops it
            if llm is None or not sm.ready or llm.engine is None:  # an embedding model has no engine
                continue
            s = llm.engine.stats()
            if s["spec_method"]:
                proposed.add_metric([sm.name], s["spec_proposed_tokens"])
                accepted.add_metric([sm.name], s["spec_accepted_tokens"])
                rate.add_metric([sm.name], s["spec_acceptance_rate"])
            g["running_sequences"].add_metric([sm.name], s["running"])
            g["waiting_sequences"].add_metric([sm.name], s["waiting"])
            g["kv_blocks_used"].add_metric([sm.name], s["kv_blocks_used"])
            g["kv_blocks_total"].add_metric([sm.name], s["kv_blocks_total"])
            g["kv_blocks_cached"].add_metric([sm.name], s["kv_blocks_cached"])
            g["prefix_cache_hit_rate"].add_metric([sm.name], s["prefix_cache_hit_rate"])
            for key in ("kv_bytes", "window_blocks_used", "window_blocks_total", "window_bytes", "state_slots_used",
                        "state_slots_total", "state_bytes"):
                g[key].add_metric([sm.name], s[key])
            preempt.add_metric([sm.name], s["preemptions"])
            queries.add_metric([sm.name], s["prefix_cache_queries"])
            hits.add_metric([sm.name], s["prefix_cache_hits"])
            compiles.add_metric([sm.name], s["grammar_cache_misses"])
            reuses.add_metric([sm.name], s["grammar_cache_hits"])
            compile_s.add_metric([sm.name], s["grammar_compile_seconds"])
            if "prompt_cache_bytes" in s:
                for key, m in disk.items():
                    m.add_metric([sm.name], s[key])
                disk_bytes.add_metric([sm.name], s["prompt_cache_bytes"])
        yield from g.values()
        yield from (preempt, queries, hits, compiles, reuses, compile_s, proposed, accepted, rate, *disk.values(),
                    disk_bytes, *extra)


class Metrics:
    def __init__(self, served, budget: int = 0):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("edgeinfer_requests", "HTTP generation requests", ["model", "endpoint", "status"],
                                registry=r)
        self.prompt_tokens = Counter("edgeinfer_prompt_tokens", "Prompt tokens received", ["model"], registry=r)
        self.completion_tokens = Counter("edgeinfer_completion_tokens", "Tokens generated", ["model"], registry=r)
        self.ttft = Histogram("edgeinfer_time_to_first_token_seconds", "Request arrival to first token", ["model"],
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("edgeinfer_time_per_output_token_seconds", "Time between output tokens", ["model"],
                              buckets=LATENCY_BUCKETS, registry=r)
        r.register(_EngineCollector(served, budget))

    def token(self, labels, seconds: float, first: bool) -> None:
        (self.ttft if first else self.tpot).labels(labels[0]).observe(seconds)

    def finish(self, labels, status: str, prompt_tokens: int, completion_tokens: int) -> None:
        model, endpoint = labels
        self.requests.labels(model, endpoint, status).inc()
        if prompt_tokens:
            self.prompt_tokens.labels(model).inc(prompt_tokens)
        if completion_tokens:
            self.completion_tokens.labels(model).inc(completion_tokens)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
