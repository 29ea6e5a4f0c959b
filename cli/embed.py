"""`edgeinfer embed`: embed texts and print the /v1/embeddings JSON."""

from __future__ import annotations

import json

import click
import numpy as np

from edgeinfer import registry

from .common import load


@click.command()
@click.argument("model")
@click.argument("texts", nargs=-1)
@click.option("--file", "file", type=click.File("r", encoding="utf-8"), default=None,
              help="Embed each non-empty line of this file ('-': standard input), after any TEXTs.")
@click.option("--dimensions", type=click.IntRange(1, None), default=None,
              help="Keep the first N values of each vector, renormalised (Matryoshka models).")
@click.option("--truncate", is_flag=True, help="Cut texts longer than the context (default: an error).")
@click.option("--no-normalize", "no_normalize", is_flag=True, help="Raw pooled vectors, not unit length.")
@click.option("--pooling", type=click.Choice(["mean", "cls", "last"]), default=None,
              help="How token vectors become one (default: the model's; mean for generative models).")
@click.option("--threads", type=click.IntRange(0, None), default=0, help="Compute threads (default: all cores).")
def embed(model, texts, file, dimensions, truncate, no_normalize, pooling, threads):
    """Embed TEXTs with MODEL and print the /v1/embeddings JSON: {"model", "data": [{"index",
    "embedding"}], "usage"}.

    nomic-embed-text-v1.5 expects a task prefix, which you add:

        edgeinfer embed nomic-embed-text-v1.5 "search_query: what is a KV cache?"
        edgeinfer embed nomic-embed-text-v1.5 --file passages.txt   # lines like "search_document: ..."

    A generative model gives its mean-pooled final hidden state (llama.cpp's --embedding)."""
    items = list(texts)
    if file is not None:
        items += [line.rstrip("\n") for line in file if line.strip()]
    if not items:
        raise click.UsageError("give at least one TEXT or --file")
    from edgeinfer.openai.responses import embeddings_response  # pure functions: no HTTP stack imported

    llm = load(model, threads)
    seqs = llm.embed_tokens(items, truncate)
    vecs = llm.embed_ids(seqs, normalize=not no_normalize, pooling=pooling, dimensions=dimensions)
    vecs = vecs.astype(np.float64).round(7)  # 7 digits: float32's precision, printed shorter
    click.echo(json.dumps(embeddings_response(registry.model_name(model), vecs, sum(len(s) for s in seqs))))
