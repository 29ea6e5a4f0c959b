"""`edgeinfer bench`: in-process measurements of one model (see edgeinfer.bench)."""

from __future__ import annotations

import click

from edgeinfer import registry

from .common import engine_options, load, speculation_options


@click.command()
@click.argument("model", default=registry.DEFAULT_MODEL)
@click.option("--threads", type=int, default=0, help="Compute threads (default: all cores).")
@click.option("--repeats", type=click.IntRange(1, 50), default=3, show_default=True, help="Runs per figure; medians reported.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True, help="Kernel backend.")
@click.option("--json", "as_json", is_flag=True, help="End with one JSON object of the figures.")
@click.option("--first-run", is_flag=True, help="Also time a first run: a fresh process with an empty kernel cache.")
@click.option("--spec-prompts", type=click.Path(exists=True, dir_okay=False), default=None,
              help="With --draft-model or --speculate: a JSON list of prompts (strings, or {\"prompt\"|\"messages\"}) "
                   "to measure speculation on (default: a few built-in code prompts).")
@click.option("--spec-only", is_flag=True, help="With --draft-model or --speculate: only the with/without comparison.")
@lambda f: engine_options(f, budget=False)
@speculation_options
def bench(model, threads, repeats, device, as_json, first_run, spec_prompts, spec_only, kv_type, max_context, draft,
          speculate, draft_tokens):
    """Measure prompt processing, decode (1 and 8 streams), start-up (with its breakdown) and memory. With
    --draft-model or --speculate, also decode with and without speculation on code prompts, side by side."""
    from edgeinfer import bench as b

    if spec_only and not (draft or speculate):
        raise click.UsageError("--spec-only needs --draft-model or --speculate")
    llm = load(model, threads, device, kv_type, max_context, draft=draft, speculate=speculate,
               draft_tokens=draft_tokens)
    res = b.run(llm, repeats=repeats, threads=threads, progress=lambda s: click.echo(f"  {s}", err=True),
                first_run_too=first_run, spec_prompts=b.load_spec_prompts(spec_prompts), spec_only=spec_only)
    click.echo(b.format_table(res))
    if as_json:
        click.echo(b.to_json(res))
