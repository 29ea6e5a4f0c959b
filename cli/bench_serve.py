"""`edgeinfer bench-serve`: a load test of any OpenAI-compatible server (see edgeinfer.bench.serve)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path

import click


@click.command("bench-serve")
@click.option("--base-url", required=True, help="The server, e.g. http://127.0.0.1:8080 (a trailing /v1 is fine).")
@click.option("--model", default=None, help="The model name to send (default: the first of /v1/models).")
@click.option("--endpoint", type=click.Choice(["completions", "chat"]), default="completions", show_default=True,
              help="/v1/completions or /v1/chat/completions.")
@click.option("--workload", type=click.Choice(["fixed", "mixed", "shared-prefix", "priority"]), default="fixed",
              show_default=True, help="fixed lengths; a seeded mix of short and long; a long common prefix + "
              "distinct questions; a fraction of requests with a higher priority.")
@click.option("--num-prompts", type=click.IntRange(1, None), default=100, show_default=True, help="Requests per run.")
@click.option("--request-rate", default="inf", show_default=True,
              help="Requests per second (Poisson, or gamma with --burstiness); inf: all at once.")
@click.option("--burstiness", type=click.FloatRange(0, None, min_open=True), default=1.0, show_default=True,
              help="Shape of the gamma-distributed gaps: 1 = Poisson, below 1 burstier.")
@click.option("--concurrency", type=click.IntRange(1, None), default=None,
              help="At most N requests in flight; with rate inf, a closed loop of N clients.")
@click.option("--sweep", default=None, help="Several rates, e.g. 0.5,1,2,4,inf: one run each, and a chart.")
@click.option("--input-len", type=click.IntRange(1, None), default=128, show_default=True, help="Prompt tokens.")
@click.option("--output-len", type=click.IntRange(1, None), default=64, show_default=True, help="Output tokens.")
@click.option("--prefix-len", type=click.IntRange(1, None), default=512, show_default=True,
              help="shared-prefix: tokens of the common system prompt.")
@click.option("--long-fraction", type=click.FloatRange(0, 1), default=0.2, show_default=True,
              help="mixed: the fraction of long requests.")
@click.option("--priority-fraction", type=click.FloatRange(0, 1), default=0.2, show_default=True,
              help="priority: the fraction sent with --high-priority.")
@click.option("--high-priority", type=int, default=-1, show_default=True,
              help="priority: the value urgent requests carry (lower runs first; 0 is the default of the rest).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--warmup", type=click.IntRange(0, None), default=2, show_default=True,
              help="Requests sent first and not counted.")
@click.option("--timeout", type=click.FloatRange(0, None, min_open=True), default=300.0, show_default=True,
              help="Seconds one request may take.")
@click.option("--wait", type=click.FloatRange(0, None), default=300.0, show_default=True,
              help="Seconds to wait for a server still loading its model (its /health answers 503); 0: do not wait.")
@click.option("--slo-ttft-ms", type=click.FloatRange(0, None, min_open=True), default=None,
              help="Goodput counts requests with TTFT at most this.")
@click.option("--slo-tpot-ms", type=click.FloatRange(0, None, min_open=True), default=None,
              help="Goodput counts requests with TPOT at most this.")
@click.option("--temperature", type=click.FloatRange(0, 2), default=0.0, show_default=True)
@click.option("--no-ignore-eos", is_flag=True, help="Let requests stop at EOS (output lengths then vary).")
@click.option("--api-key", envvar="OPENAI_API_KEY", default=None, help="Sent as a Bearer token (or OPENAI_API_KEY).")
@click.option("--tokenizer", default=None,
              help="A model name or GGUF path whose tokenizer counts prompt tokens (for servers without /tokenize).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write the JSON results (and a sweep's chart) here.")
@click.option("--label", default=None, help="The server's name in the results and chart (default: the URL).")
@click.option("--json", "as_json", is_flag=True, help="End with one JSON object (a sweep: the last rate's).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def bench_serve(base_url, model, endpoint, workload, num_prompts, request_rate, burstiness, concurrency, sweep, input_len,
                output_len, prefix_len, long_fraction, priority_fraction, high_priority, seed, warmup, timeout, wait,
                slo_ttft_ms, slo_tpot_ms, temperature, no_ignore_eos, api_key, tokenizer, out_dir, label, as_json, quiet):
    """Load-test an OpenAI-compatible server: TTFT, TPOT, ITL, latency percentiles, throughput, goodput."""
    try:
        import httpx  # noqa: F401
        import prometheus_client  # noqa: F401
    except ImportError as e:
        raise click.ClickException(f"bench-serve needs the 'bench' extra ({e.name} is not installed): "
                                   f"pip install 'edgeinfer[bench]'") from None
    from edgeinfer.bench import serve as bs

    rates = bs.parse_rates(sweep if sweep else request_rate)
    cfg = bs.BenchConfig(base_url=base_url, model=model, endpoint=endpoint, workload=workload, num_prompts=num_prompts,
                         request_rate=rates[0], burstiness=burstiness, concurrency=concurrency, input_len=input_len,
                         output_len=output_len, prefix_len=prefix_len, long_fraction=long_fraction,
                         priority_fraction=priority_fraction, high_priority=high_priority, seed=seed, warmup=warmup,
                         timeout=timeout, wait=wait,
                         slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, temperature=temperature,
                         ignore_eos=not no_ignore_eos, api_key=api_key, tokenizer=tokenizer, progress=not quiet)
    runs, info = asyncio.run(bs.bench_serve(cfg, rates))
    name = label or base_url
    click.echo(f"{name}  model {cfg.model}  {endpoint}  workload {workload}  {num_prompts} requests  "
               f"in {input_len} / out {output_len} tokens" + (f"  concurrency {concurrency}" if concurrency else ""))
    click.echo(bs.format_table(runs))
    for run in runs:
        for lab, d in (run.get("by_label") or {}).items():
            click.echo(f"  rate {run['request_rate']}: {lab:<13} {d['completed']}/{d['requests']} done, "
                       f"TTFT mean {_ms(d['ttft_ms_mean'])} p99 {_ms(d['ttft_ms_p99'])}, "
                       f"E2E p50 {_ms(d['e2e_ms_p50'])}")
        if run["errors"]:
            click.echo(f"  rate {run['request_rate']}: errors {run['errors_by_kind']}")
    if sweep and out_dir is None:
        out_dir = "bench-serve-results"
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        record = bs.result_record(cfg, runs, {**info, "label": name})
        path = out / f"bench-serve-{stamp}.json"
        path.write_text(json.dumps(record, indent=1))
        click.echo(f"results: {path}")
        if sweep:
            chart = bs.plot_sweep({name: runs}, out / f"bench-serve-{stamp}.png",
                                  title=f"{cfg.model}: {workload}, in {input_len} / out {output_len} tokens")
            click.echo(f"chart: {chart}")
    if as_json:
        click.echo(json.dumps(runs[-1]))


def _ms(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.0f} ms"
