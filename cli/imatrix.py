"""`edgeinfer imatrix`: a model's importance matrix over a calibration text, llama-imatrix's way."""

from __future__ import annotations

import time

import click

from .common import engine_options, load


@click.command()
@click.argument("model")
@click.argument("text", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="The imatrix file to write (llama.cpp's formats: see --output-format).")
@click.option("--output-format", type=click.Choice(["gguf", "dat"]), default=None,
              help="gguf (llama.cpp's current format) or dat (its legacy one); default: dat for a .dat name, "
                   "else gguf.")
@click.option("--ctx", "n_ctx", type=int, default=512, show_default=True, help="Tokens per chunk.")
@click.option("--chunks", type=int, default=None, help="Chunks to process at most (default: all the text has).")
@click.option("--in-file", "in_files", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="An imatrix file (GGUF or .dat) to add to (repeatable); without TEXT, the files are only combined.")
@click.option("--process-output", is_flag=True, help="Collect output.weight's input too (llama.cpp: off by default).")
@click.option("--threads", type=int, default=0, help="Compute threads (default: all cores).")
@lambda f: engine_options(f, budget=False)
def imatrix(model, text, output, output_format, n_ctx, chunks, in_files, process_output, threads, kv_type,
            max_context):
    """Compute the importance matrix of MODEL over the calibration TEXT file (llama-imatrix's method and
    file formats: llama-quantize --imatrix reads either)."""
    from edgeinfer.imatrix import collect, combine

    if n_ctx < 1:
        raise click.BadParameter(f"must be >= 1, got {n_ctx}", param_hint="--ctx")
    if chunks is not None and chunks < 1:
        raise click.BadParameter(f"must be >= 1, got {chunks}", param_hint="--chunks")
    base = combine(in_files, n_ctx) if in_files else None
    t0 = time.perf_counter()
    if text is None:
        if base is None:
            raise click.UsageError("give a TEXT file to compute an imatrix over, or --in-file files to combine")
        from edgeinfer import registry
        from edgeinfer.gguf_file import GGUFFile

        with GGUFFile(registry.resolve(model, pull_missing=False)) as gf:
            base.check(gf.tensors)
        im, what = base, f"{len(in_files)} files combined"
    else:
        try:
            with open(text, encoding="utf-8") as fh:
                body = fh.read()
        except UnicodeDecodeError as e:
            raise click.ClickException(f"{text} is not UTF-8 text: {e}") from None
        llm = load(model, threads, kv_type=kv_type, max_context=max_context)
        im = collect(llm, body, n_ctx=n_ctx, chunks=chunks, process_output=process_output, dataset=text,
                     progress=True, into=base)
        im.check(llm.gguf.tensors)
        what = f"{max(int(e.counts.max()) for e in im.entries.values()) // n_ctx} chunks of {n_ctx} tokens"
    fmt = im.save(output, output_format, n_ctx)
    click.echo(f"{output}: {len(im)} matrices, {what}, {fmt} format ({time.perf_counter() - t0:.1f} s)")
