"""`edgeinfer serve`: models over an OpenAI-compatible HTTP API, loaded at start or on demand, with a
memory budget and speculation arranged here before the server starts."""

from __future__ import annotations

import os
import sys

import click

from edgeinfer import registry

from .common import engine_options, lora_list, lora_options


@click.command()
@click.argument("models", nargs=-1, required=False)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (0.0.0.0: every network).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True)
@click.option("--api-key", envvar="EDGEINFER_API_KEY", default=None,
              help="Require 'Authorization: Bearer KEY' on /v1 routes (or EDGEINFER_API_KEY).")
@click.option("--cors-origin", "cors_origins", multiple=True, help="Allow browser requests from this origin (repeatable).")
@click.option("--max-queue", type=click.IntRange(0, None), default=64, show_default=True,
              help="Requests that may wait for a slot; past it, 503 with Retry-After.")
@click.option("--request-timeout", type=click.FloatRange(0.1, None), default=600.0, show_default=True,
              help="Seconds a request may take.")
@click.option("--read-timeout", type=click.FloatRange(0.1, None), default=30.0, show_default=True,
              help="Seconds a request's whole body may take to arrive (408 past it).")
@click.option("--max-body", "max_body_bytes", type=click.IntRange(1, None), default=None,
              help="Largest request body in bytes (413 past it; default 4 MiB, 64 MiB with --mmproj: images).")
@click.option("--max-seqs", type=click.IntRange(0, None), default=0, help="Sequences computed together (0: sized for the cores).")
@click.option("--threads", type=click.IntRange(0, None), default=0, help="Compute threads (default: all cores).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True, help="Kernel backend.")
@click.option("--shutdown-timeout", type=click.FloatRange(0, None), default=10.0, show_default=True,
              help="Seconds to let in-flight requests finish on SIGTERM/SIGINT.")
@click.option("--draft-model", "drafts", multiple=True, metavar="[TARGET=]DRAFT",
              help="Speculative decoding: DRAFT drafts for the one served model, or for TARGET among several "
                   "(repeatable).")
@click.option("--speculate", type=click.Choice(["lookup"]), default=None,
              help="lookup: prompt-lookup speculation for every served model without a draft model.")
@click.option("--draft-tokens", type=click.IntRange(1, 32), default=None,
              help="Tokens proposed per step at most (default: 4 with a draft model, 8 with lookup).")
@click.option("--reasoning-format", type=click.Choice(["auto", "none", "deepseek"]), default="auto", show_default=True,
              help="Chat replies' <think> blocks as reasoning_content: auto (when the model's template thinks), "
                   "deepseek (always), none (left in the text).")
@click.option("--models-dir", "models_dirs", multiple=True,
              type=click.Path(exists=True, file_okay=False, dir_okay=True, resolve_path=True),
              help="A folder whose .gguf files requests may name, by file name or path (repeatable); nothing "
                   "outside these folders is served.")
@click.option("--keep-alive", "keep_alive", default=None, metavar="DURATION",
              help="How long a model stays loaded once idle: seconds or a duration (30s, 5m, 1h; 0: unload at "
                   "once; -1: forever). Default 5m; given, it applies to the MODELS named here too (else they "
                   "stay loaded).")
@click.option("--allow-pull", is_flag=True, default=False,
              help="Let clients download catalog models into the model cache with Ollama's POST /api/pull.")
@click.option("--allow-delete", is_flag=True, default=False,
              help="Let Ollama's DELETE /api/delete remove .gguf files under --models-dir (created and downloaded "
                   "models can be deleted without it).")
@click.option("--prompt-cache", "prompt_cache", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="Keep computed prompt blocks in DIR too, written as they are computed, and use them after a "
                   "restart (one folder per model file and KV type).")
@click.option("--prompt-cache-mb", type=click.FloatRange(1, None), default=1024.0, show_default=True,
              help="MB of --prompt-cache per model at most (the least recently used blocks are removed).")
@click.option("--slot-save-path", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="Let clients save and restore slots' KV to and from files in DIR (llama.cpp's POST "
                   "/slots/ID?action=save|restore).")
@click.option("--mmproj", "mmprojs", multiple=True, metavar="[MODEL=]FILE",
              help="The model's vision projector (an mmproj GGUF, as llama.cpp's --mmproj): its chat requests may "
                   "then hold images (OpenAI image_url parts with data: URLs, Ollama's images). With several "
                   "models, say which (MODEL=FILE); repeatable.")
@click.option("--allow-image-urls", is_flag=True, default=False,
              help="Fetch http(s) image URLs in chat requests (at most 32 MB each); without it only data: URLs are "
                   "read (the server never reaches out on a client's behalf).")
@lambda f: lora_options(f, serve=True)
@engine_options
def serve(models, host, port, api_key, cors_origins, max_queue, request_timeout, read_timeout, max_body_bytes, max_seqs, threads,
          device, shutdown_timeout, drafts, speculate, draft_tokens, reasoning_format, models_dirs, keep_alive,
          allow_pull, allow_delete, prompt_cache, prompt_cache_mb, slot_save_path, mmprojs, allow_image_urls, loras,
          loras_scaled, kv_type, max_context, memory_budget):
    """Serve MODELS over an OpenAI-compatible HTTP API (and Ollama's /api/ps). MODELS load at start; any
    other model that is downloaded (or under a --models-dir) loads when a request names it, and unloads
    when idle for --keep-alive. With no MODELS, a request that names no model gets smollm2-135m-instruct.
    --memory-budget: the loaded models together fit it (the least recently used idle ones are evicted)."""
    try:
        import prometheus_client  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise click.ClickException(f"the server needs the 'serve' extra ({e.name} is not installed): "
                                   f"pip install 'edgeinfer[serve]'") from None
    from edgeinfer.config import EngineConfig
    from edgeinfer.server.app import ServerConfig
    from edgeinfer.openai.times import parse_keep_alive
    from edgeinfer.server.run import serve as run_server

    if keep_alive is not None:
        try:
            keep_alive = parse_keep_alive(keep_alive)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="'--keep-alive'") from None
    models = list(models)
    paths = [registry.resolve(m, progress=True) for m in models]  # fail fast on unknown names; pull now
    if device != "cpu":  # fail now, not in the loading thread
        from edgeinfer.kernels import get_backend

        try:
            get_backend(device)
        except RuntimeError as e:
            raise click.ClickException(str(e)) from None
    base = EngineConfig(threads=threads, max_seqs=max_seqs, backend=device, kv_dtype=kv_type or "",
                        max_context=max_context, prompt_cache=prompt_cache or "", prompt_cache_mb=prompt_cache_mb)
    per_model = None
    if memory_budget:  # one budget for the whole process: every model's weights, KV and buffers
        per_model = dict(zip(models, budget_configs(paths, base, memory_budget)))
    speculation = serve_speculation(models, drafts, speculate, draft_tokens, device)
    if max_body_bytes is None:  # a conversation with images resends them every turn, as base64
        max_body_bytes = (64 if mmprojs else 4) * 1024 * 1024
    adapters = serve_adapters(models, paths, lora_list(loras, loras_scaled, serve=True), device)
    if adapters:  # LLM's lora=, beside its speculation
        speculation[models[0]] = {**speculation.get(models[0], {}), "lora": adapters}
    for source, path in serve_projectors(models, mmprojs).items():  # LLM's mmproj=, beside its speculation
        speculation[source] = {**speculation.get(source, {}), "mmproj": path, "allow_image_urls": allow_image_urls}
    cfg = ServerConfig(models=models, threads=threads, api_key=api_key, cors_origins=list(cors_origins),
                       max_queue=max_queue, request_timeout=request_timeout, read_timeout=read_timeout,
                       max_body_bytes=max_body_bytes,
                       max_seqs=max_seqs, backend=device, engine_config=base, model_configs=per_model,
                       speculation=speculation, reasoning_format=reasoning_format, models_dirs=list(models_dirs),
                       keep_alive=keep_alive, memory_budget_mb=memory_budget, allow_pull=allow_pull,
                       allow_delete=allow_delete,
                       slot_save_path=slot_save_path or "",
                       on_demand_speculation=({"speculate": speculate, "draft_tokens": draft_tokens or 0}
                                              if speculate else None))
    sys.exit(run_server(cfg, host=host, port=port, shutdown_timeout=shutdown_timeout))


def serve_adapters(models: list[str], paths, adapters: list, device: str) -> list:
    """serve's --lora and --lora-scaled for its one model, each read and checked against the model file's tensors
    now (llama.cpp's checks; what the load checks beyond them is reported by /health and the model's requests)."""
    if not adapters:
        return []
    if len(models) != 1:
        raise click.UsageError("--lora: serve one model with adapters (name it on the command line)")
    if device != "cpu":
        raise click.UsageError(f"--lora: LoRA adapters are not on the {device} backend yet (use the CPU)")
    clash = next((n for _, _, n in adapters if n == registry.model_name(models[0])), None)
    if clash:
        raise click.BadParameter(f"an adapter named {clash!r} would hide the model of that name: name it "
                                 "(NAME=FILE)", param_hint="--lora")
    from edgeinfer.gguf_file import GGUFFile
    from edgeinfer.models.lora import check_file, read

    with GGUFFile(paths[0]) as gf:
        for path, _, _ in adapters:
            check_file(read(path, gf.architecture), gf)  # a ModelLoadError: the CLI's one-line error
    return adapters


def serve_projectors(models: list[str], mmprojs) -> dict:
    """model source -> its projector file, from serve's --mmproj [MODEL=]FILE."""
    by_name = {registry.model_name(m): m for m in models}
    out: dict[str, str] = {}
    for spec in mmprojs:
        target, sep, path = spec.rpartition("=")
        if not sep or not target:
            if len(models) != 1:
                raise click.UsageError(f"--mmproj {spec}: give it for one model (MODEL=FILE)" if models else
                                       f"--mmproj {spec}: name the model it belongs to on the command line")
            target, path = models[0], spec
        target = by_name.get(target, target)
        if target not in models:
            raise click.UsageError(f"--mmproj {spec}: {target!r} is not one of the served models")
        if not os.path.isfile(path):
            raise click.BadParameter(f"{path}: no such file", param_hint="--mmproj")
        out[target] = path
    return out


def serve_speculation(models: list[str], drafts, speculate, draft_tokens, device: str) -> dict:
    """model source -> LLM speculation arguments, from serve's --draft-model [TARGET=]DRAFT, --speculate and
    --draft-tokens. Draft models are pulled now, so a bad name fails before the server starts."""
    from edgeinfer.engine.speculative import check_backend

    if drafts or speculate:
        check_backend(device)  # a one-line error through the CLI's handler
    if draft_tokens and not (drafts or speculate):
        raise click.UsageError("--draft-tokens needs --draft-model or --speculate")
    by_name = {registry.model_name(m): m for m in models}
    out: dict[str, dict] = {}
    for d in drafts:
        target, sep, draft = d.rpartition("=")
        if not sep:
            if len(models) != 1:
                raise click.UsageError(f"--draft-model {d}: with several models, say which one it drafts for "
                                       "(TARGET=DRAFT)")
            target = models[0]
        elif target in by_name:
            target = by_name[target]
        elif target not in models:
            raise click.UsageError(f"--draft-model {d}: {target!r} is not one of the served models "
                                   f"({', '.join(by_name)})")
        if target in out:
            raise click.UsageError(f"--draft-model: two drafts for {target!r}")
        registry.resolve(draft, progress=True)
        out[target] = {"draft": draft, "draft_tokens": draft_tokens or 0}
    if speculate:
        for m in models:
            out.setdefault(m, {"speculate": speculate, "draft_tokens": draft_tokens or 0})
    return out


def budget_configs(paths, base, budget_mb: float):
    """Engine configs, one per model file, that together fit budget_mb (see edgeinfer.memory)."""
    import os

    from edgeinfer import memory
    from edgeinfer.file_estimate import estimate_file
    from edgeinfer.gguf_file import GGUFFile

    ests = []
    for p in paths:
        with GGUFFile(p) as gf:
            ests.append(estimate_file(gf, base))
    return memory.fit_budget(ests, [base] * len(paths), budget_mb, [os.path.basename(p) for p in paths])
