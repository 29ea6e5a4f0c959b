"""`edgeinfer perplexity`: a model's perplexity on a text file, llama-perplexity's way."""

from __future__ import annotations

import json
import time

import click

from .common import engine_options, load


@click.command()
@click.argument("model")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--ctx", "n_ctx", type=int, default=512, show_default=True, help="Tokens per chunk.")
@click.option("--chunks", type=int, default=None, help="Chunks to score (default: all).")
@click.option("--threads", type=int, default=0)
@click.option("--json", "as_json", is_flag=True)
@lambda f: engine_options(f, budget=False)
def perplexity(model, file, n_ctx, chunks, threads, as_json, kv_type, max_context):
    """Perplexity of MODEL on a text FILE, llama-perplexity's way (second half of each chunk scored)."""
    try:
        text = open(file, encoding="utf-8").read()
    except UnicodeDecodeError as e:
        raise click.ClickException(f"{file} is not UTF-8 text: {e}") from None
    llm = load(model, threads, kv_type=kv_type, max_context=max_context)
    t0 = time.perf_counter()
    r = llm.perplexity_details(text, n_ctx=n_ctx, chunks=chunks, progress=True)
    r["seconds"] = round(time.perf_counter() - t0, 2)
    click.echo(json.dumps(r) if as_json else f"perplexity: {r['ppl']:.4f} ({r['chunks']} chunks of {n_ctx}, "
               f"{r['n_scored']} tokens scored, {r['tok_s']} tok/s, {r['seconds']} s)")
