"""bench-serve's figures: latency percentiles, throughput and goodput from the request records, the
goodput knee of a sweep, and the table, chart and JSON record of the results."""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import numpy as np

from .client import RequestResult
from .config import BenchConfig

PERCENTILES = (50, 90, 95, 99)


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
