"""`edgeinfer batch`: a batch file through one model, here or on a Ray cluster."""

from __future__ import annotations

import json
import sys

import click

from .common import engine_options, lora_list, lora_options


@click.command()
@click.argument("model")
@click.argument("input_path", metavar="INPUT.jsonl", type=click.Path(dir_okay=False))
@click.argument("output_path", metavar="OUTPUT.jsonl", type=click.Path(dir_okay=False))
@click.option("--retry-errors", is_flag=True, help="Answer again the requests whose earlier answer was an error.")
@click.option("--threads", type=click.IntRange(0, None), default=0,
              help="Compute threads (default: all cores; with --ray, per worker: default 1).")
@click.option("--max-seqs", type=click.IntRange(0, None), default=0,
              help="Sequences computed together (0: sized for the cores).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True, help="Kernel backend.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="auto", default=None, metavar="[ADDRESS]",
              help="Run on a Ray cluster: --ray alone joins the one this machine belongs to (ray start), "
                   "--ray local starts one here, --ray HOST:PORT or ray://HOST:10001 names one.")
@click.option("--workers", type=click.IntRange(1, None), default=None,
              help="With --ray: model replicas (Ray actors), default as many as the cluster's CPUs allow.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
@lambda f: lora_options(f, serve=True)
@engine_options
def batch(model, input_path, output_path, retry_errors, threads, max_seqs, device, ray_address, workers, quiet,
          as_json, loras, loras_scaled, kv_type, max_context, memory_budget):
    """Answer every request of INPUT.jsonl (OpenAI's batch file format) into OUTPUT.jsonl.

    Each input line is {"custom_id", "method": "POST", "url", "body"} for /v1/chat/completions,
    /v1/completions or /v1/embeddings; each output line is {"id", "custom_id", "response":
    {"status_code", "body"}, "error"}. Run it again to resume: requests already answered are skipped."""
    if workers is not None and ray_address is None:
        raise click.UsageError("--workers needs --ray")
    lora = lora_list(loras, loras_scaled, serve=True)  # a line's "model": NAME chooses adapter NAME
    if lora and ray_address is not None:
        raise click.UsageError("--lora with --ray is not there yet: run the batch here")
    if ray_address is not None:
        from edgeinfer import batch_ray

        if device != "cpu":
            raise click.UsageError("--ray runs CPU workers; --device cuda on Ray is not there yet")
        run = lambda: batch_ray.run_batch_ray(  # noqa: E731
            model, input_path, output_path, address=ray_address, workers=workers, threads=threads or 1,
            retry_errors=retry_errors, progress=not quiet, engine_kwargs=dict(
                kv_dtype=kv_type or "", max_context=max_context, memory_budget_mb=memory_budget),
            max_seqs=max_seqs)
    else:
        from edgeinfer import LLM
        from edgeinfer.batch import Job, run_job
        from edgeinfer.config import EngineConfig

        job = Job(input_path, output_path, retry_errors, progress=not quiet)  # before the model loads
        if not job.todo:  # every request answered already: no model to load
            run = job.close
        else:
            try:
                llm = LLM(model, engine_config=EngineConfig(
                    threads=threads, backend=device, kv_dtype=kv_type or "", max_context=max_context,
                    memory_budget_mb=memory_budget, max_seqs=max_seqs), lora=lora or None)
            except BaseException:
                job.close()
                raise
            run = lambda: run_job(llm, job)  # noqa: E731
    try:
        summary = run()  # a BatchError is an EdgeInferError: main's one-line "error: ..."
    except KeyboardInterrupt:
        click.echo(f"interrupted: the answers so far are in {output_path}; run the same command again to "
                   "resume", err=True)
        sys.exit(130)
    click.echo(summary.line(), err=True)
    if as_json:
        click.echo(json.dumps(summary.to_dict()))
