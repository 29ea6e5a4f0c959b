"""`generate`, `chat`, `perplexity` and `warmup`: the commands that run a model."""

from __future__ import annotations

import json
import sys
import time

import click
import numpy as np

from edgeinfer import registry
from edgeinfer.config import KV_TYPES


def sampling_options(f, temperature: float = 0.8):
    for opt in reversed([
        click.option("--max-tokens", "-n", type=int, default=256, show_default=True, help="Tokens to generate at most."),
        click.option("--temperature", "-t", type=float, default=temperature, show_default=True, help="0 for greedy."),
        click.option("--top-p", type=float, default=0.95, show_default=True),
        click.option("--top-k", type=int, default=40, show_default=True, help="0 disables it."),
        click.option("--min-p", type=float, default=0.05, show_default=True),
        click.option("--repeat-penalty", type=float, default=1.0, show_default=True),
        click.option("--seed", type=int, default=None, help="Same seed, same text."),
        click.option("--stop", multiple=True, help="Stop at this string (repeatable); it is not printed."),
        click.option("--threads", type=int, default=0, help="Compute threads (default: all cores)."),
        click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
                     help="Kernel backend."),
    ]):
        f = opt(f)
    return engine_options(f)


def engine_options(f, budget: bool = True):
    """--kv-type, --max-context and (where a budget applies) --memory-budget."""
    opts = [
        click.option("--kv-type", type=click.Choice(KV_TYPES), default=None,
                     help="KV cache storage (default: f16 on the CPU, f32 on CUDA); q8_0 needs about half of f16."),
        click.option("--max-context", type=click.IntRange(0, None), default=0,
                     help="Tokens per sequence at most (default: the model's context, capped at 4096)."),
    ]
    if budget:
        opts.append(click.option("--memory-budget", "memory_budget", type=click.FloatRange(0, None), default=0.0,
                                 help="MB the process may use: the KV cache and sequences are sized to fit "
                                      "(an error names the smallest budget that would)."))
    for opt in reversed(opts):
        f = opt(f)
    return f


def constraint_options(f):
    """Structured output: --json-schema, --regex, --choice, --grammar (at most one)."""
    for opt in reversed([
        click.option("--json-schema", "json_schema", metavar="FILE|JSON",
                     help="The output is JSON matching this schema (a file, or the schema itself)."),
        click.option("--regex", default=None, help="The output matches this regular expression."),
        click.option("--choice", default=None, metavar="A,B,...", help="The output is one of these strings."),
        click.option("--grammar", default=None, metavar="FILE",
                     help="The output follows this grammar: Lark (llguidance's syntax) or llama.cpp's GBNF."),
    ]):
        f = opt(f)
    return f


def constraint_kwargs(json_schema, regex, choice, grammar) -> dict:
    """SamplingParams' constraint fields from the options; a bad file or bad JSON is a usage error."""
    out = {}
    if json_schema is not None:
        text = json_schema
        if not json_schema.lstrip().startswith("{"):
            try:
                with open(json_schema, encoding="utf-8") as fh:
                    text = fh.read()
            except OSError as e:
                raise click.BadParameter(f"cannot read {json_schema}: {e.strerror}", param_hint="--json-schema")
        try:
            out["json_schema"] = json.loads(text)
        except json.JSONDecodeError as e:
            raise click.BadParameter(f"not valid JSON: {e}", param_hint="--json-schema")
    if regex is not None:
        out["regex"] = regex
    if choice is not None:
        out["choice"] = [c.strip() for c in choice.split(",") if c.strip()]
    if grammar is not None:
        try:
            with open(grammar, encoding="utf-8") as fh:
                out["grammar"] = fh.read()
        except OSError as e:
            raise click.BadParameter(f"cannot read {grammar}: {e.strerror}", param_hint="--grammar")
    if len(out) > 1:
        raise click.UsageError("give at most one of --json-schema, --regex, --choice and --grammar")
    return out


def speculation_options(f):
    """--draft-model, --speculate and --draft-tokens: speculative decoding."""
    for opt in reversed([
        click.option("--draft-model", "draft", default=None, metavar="NAME|PATH",
                     help="Speculative decoding with this smaller model of the same vocabulary as the draft "
                          "(e.g. qwen2.5-coder-0.5b-instruct for qwen2.5-coder-1.5b-instruct). Greedy output is "
                          "unchanged; sampled output keeps the model's distribution."),
        click.option("--speculate", type=click.Choice(["lookup"]), default=None,
                     help="lookup: speculative decoding by prompt lookup (proposals copied from earlier in the "
                          "prompt or output; no second model). Fast where the answer repeats its input."),
        click.option("--draft-tokens", type=click.IntRange(1, 32), default=None,
                     help="Tokens proposed per step at most (default: 4 with a draft model, 8 with lookup); "
                          "adapts to the acceptance rate below that."),
    ]):
        f = opt(f)
    return f


def make_params(max_tokens, temperature, top_p, top_k, min_p, repeat_penalty, seed, stop, **constraint):
    from edgeinfer.sampling import SamplingParams

    return SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                          repetition_penalty=repeat_penalty, max_tokens=max_tokens, seed=seed, stop=tuple(stop),
                          **constraint)


def load(model: str, threads: int, device: str = "cpu", kv_type: str | None = None, max_context: int = 0,
         memory_budget: float = 0.0, draft: str | None = None, speculate: str | None = None,
         draft_tokens: int | None = None):
    from edgeinfer import LLM

    if threads < 0:
        raise click.BadParameter(f"--threads must be >= 0, got {threads}")
    return LLM(model, threads=threads, backend=device, kv_type=kv_type or "", max_context=max_context,
               memory_budget_mb=memory_budget, progress=True, draft=draft, speculate=speculate,
               draft_tokens=draft_tokens or 0)


@click.command()
@click.argument("model")
@click.argument("prompt")
@sampling_options
@constraint_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: text and timing stats.")
@click.option("--special", is_flag=True, help="Parse special-token text (like <|im_start|>) in the prompt.")
@speculation_options
def generate(model, prompt, max_tokens, temperature, top_p, top_k, min_p, repeat_penalty, seed, stop, threads,
             device, kv_type, max_context, memory_budget, json_schema, regex, choice, grammar, as_json, special,
             draft, speculate, draft_tokens):
    """Continue PROMPT with MODEL, streaming the text."""
    params = make_params(max_tokens, temperature, top_p, top_k, min_p, repeat_penalty, seed, stop,
                         **constraint_kwargs(json_schema, regex, choice, grammar))
    llm = load(model, threads, device, kv_type, max_context, memory_budget, draft, speculate, draft_tokens)
    t0 = time.perf_counter()
    first = None
    text, ids, reason = [], [], None
    try:
        for chunk in llm.stream(prompt, params, parse_special=special):
            first = first or time.perf_counter()
            text.append(chunk.text)
            ids.extend(chunk.token_ids)
            reason = chunk.finish_reason or reason
            if not as_json:
                click.echo(chunk.text, nl=False)
                sys.stdout.flush()
    except KeyboardInterrupt:
        reason = "abort"
    end = time.perf_counter()
    n_prompt = len(llm._prompt_ids(prompt, special))
    if as_json:
        decode_s = end - (first or end)
        click.echo(json.dumps({
            "text": "".join(text), "finish_reason": reason, "prompt_tokens": n_prompt, "completion_tokens": len(ids),
            "load_s": round(llm.load_seconds, 4), "ttft_s": round((first or end) - t0, 4),
            "total_s": round(end - t0, 4),
            "decode_tok_s": round((len(ids) - 1) / decode_s, 2) if len(ids) > 1 and decode_s > 0 else None,
            "prompt_tok_s": round(n_prompt / ((first or end) - t0), 2) if first else None,
            **spec_stats(llm),
        }))
    else:
        click.echo()


def spec_stats(llm) -> dict:
    """Speculative decoding's counters, when it is on."""
    s = llm.stats()
    if not s["spec_method"]:
        return {}
    return {k: round(s[k], 4) if isinstance(s[k], float) else s[k]
            for k in ("spec_method", "spec_proposed_tokens", "spec_accepted_tokens", "spec_acceptance_rate")}


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
    from edgeinfer.server.protocol import embeddings_response  # pure functions: no HTTP stack imported

    llm = load(model, threads)
    seqs = llm.embed_tokens(items, truncate)
    vecs = llm.embed_ids(seqs, normalize=not no_normalize, pooling=pooling, dimensions=dimensions)
    vecs = vecs.astype(np.float64).round(7)  # 7 digits: float32's precision, printed shorter
    click.echo(json.dumps(embeddings_response(registry.model_name(model), vecs, sum(len(s) for s in seqs))))


CHAT_HELP = "commands: /reset (new conversation), /system TEXT, /stats, /exit (or Ctrl-D); Ctrl-C stops an answer"


@click.command()
@click.argument("model", default=registry.DEFAULT_MODEL)
@lambda f: sampling_options(f, temperature=0.2)  # small chat models stay on topic at low temperature
@constraint_options
@click.option("--system", "system_prompt", default=None, help="A system message to start with.")
@speculation_options
def chat(model, max_tokens, temperature, top_p, top_k, min_p, repeat_penalty, seed, stop, threads, device,
         kv_type, max_context, memory_budget, json_schema, regex, choice, grammar, system_prompt, draft, speculate,
         draft_tokens):
    """Chat with MODEL (default: smollm2-135m-instruct, pulled on first use). With a constraint
    (--json-schema, ...) every answer follows it."""
    params = make_params(max_tokens, temperature, top_p, top_k, min_p, repeat_penalty, seed, stop,
                         **constraint_kwargs(json_schema, regex, choice, grammar))
    interactive = sys.stdin.isatty()
    llm = load(model, threads, device, kv_type, max_context, memory_budget, draft, speculate, draft_tokens)
    if interactive:
        _setup_readline()
        click.echo(f"edgeinfer chat: {llm.path.name} ({llm.config.arch}, {llm.config.n_layer} layers). {CHAT_HELP}")
    system = system_prompt
    history: list[dict] = []
    last = {}
    while True:
        try:
            line = input(">>> " if interactive else "")
        except EOFError:
            break
        except KeyboardInterrupt:
            click.echo()
            continue
        line = line.strip()
        if not line:
            continue
        if line.startswith("/"):
            cmd, _, arg = line.partition(" ")
            if cmd in ("/exit", "/quit", "/bye"):
                break
            if cmd == "/reset":
                history = []
                click.echo("(conversation cleared)")
            elif cmd == "/system":
                system = arg.strip() or None
                history = []
                click.echo(f"(system message {'set' if system else 'cleared'}; conversation cleared)")
            elif cmd == "/stats":
                click.echo(json.dumps({**last, **llm.stats()}))
            else:
                click.echo(f"unknown command {cmd}; {CHAT_HELP}")
            continue
        history.append({"role": "user", "content": line})
        messages = ([{"role": "system", "content": system}] if system else []) + history
        try:
            prompt_ids = llm.render_chat(messages)
        except ValueError as e:
            click.echo(f"error: {e}", err=True)
            history.pop()
            continue
        if len(prompt_ids) + 1 >= llm.engine.max_context:
            click.echo(f"error: the conversation has {len(prompt_ids)} tokens, the context holds "
                       f"{llm.engine.max_context}; /reset to start again", err=True)
            history.pop()
            continue
        answer, n = [], 0
        t0 = time.perf_counter()
        first = None
        try:
            for chunk in llm.stream(prompt_ids, params):
                first = first or time.perf_counter()
                answer.append(chunk.text)
                n += len(chunk.token_ids)
                click.echo(chunk.text, nl=False)
                sys.stdout.flush()
        except KeyboardInterrupt:
            click.echo(" [stopped]", nl=False)
        click.echo()
        end = time.perf_counter()
        last = {"prompt_tokens": len(prompt_ids), "completion_tokens": n, "ttft_s": round((first or end) - t0, 3),
                "decode_tok_s": round((n - 1) / (end - first), 2) if first and n > 1 and end > first else None}
        history.append({"role": "assistant", "content": "".join(answer)})


def _setup_readline():
    try:
        import atexit
        import readline

        path = registry.home() / "chat_history"
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            readline.read_history_file(path)
        except (FileNotFoundError, OSError):
            pass
        readline.set_history_length(1000)
        atexit.register(lambda: _save_history(readline, path))
    except ImportError:
        pass


def _save_history(readline, path):
    try:
        readline.write_history_file(path)
    except OSError:
        pass


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


@click.command()
@click.argument("models", nargs=-1)
@click.option("--kv-type", "kv_types", type=click.Choice(KV_TYPES), multiple=True,
              help="KV types to compile for (repeatable; default: the default one; with --all: every one).")
@click.option("--all", "all_kernels", is_flag=True,
              help="Every kernel unit of this machine's ISA tier: every weight kind and KV type (then MODELS).")
@click.option("--export", "export_path", type=click.Path(dir_okay=False), default=None,
              help="Then pack this tier's compiled kernels into FILE (.tar.gz) for other machines of the tier.")
@click.option("--import", "import_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Install a pack made by --export on a machine of the same tier; nothing is compiled.")
@click.option("--clear", is_flag=True,
              help="Empty the kernel cache (every tier and version) and the weight layouts first.")
def warmup(models, kv_types, all_kernels, export_path, import_path, clear):
    """Compile the kernels MODELS need (default: smollm2-135m-instruct) into the kernel cache, ahead of time,
    in one worker process per core.

    Kernels are compiled for each model's own weight types and KV type, so a run of a model with other
    types compiles once more; --all compiles every kind. A pack from --export serves every machine of the
    same ISA tier, Numba and edgeinfer version (`edgeinfer system` names the tier): an edge fleet compiles
    once and copies the pack to every device."""
    from edgeinfer.kernels.cpu import backend, cache, parallel_compile, units

    t0 = time.perf_counter()
    # models compile when named, or when nothing else is asked for (plain `warmup`: the default model)
    run_models = bool(models) or not (clear or import_path or all_kernels or export_path)
    if clear:
        from edgeinfer.models import layout_cache

        freed = cache.clear()
        click.echo(f"kernel cache cleared ({freed / 1e6:.1f} MB freed: {cache.root()})")
        freed = layout_cache.clear()
        click.echo(f"weight layouts cleared ({freed / 1e6:.1f} MB freed: {layout_cache.layouts_dir()})")
    if import_path:
        m = cache.import_cache(import_path)
        click.echo(f"imported {m['files']} files for tier {m['tier']} into {cache.folder()}")
    if all_kernels:
        c = parallel_compile.start(backend.KERNEL_PATH, units.FAMILY_OF, kv_types or KV_TYPES)
        if c is not None:
            c.wait()
    if run_models:
        from edgeinfer import LLM, SamplingParams

        for model in models or [registry.DEFAULT_MODEL]:
            for kv in kv_types or [""]:
                llm = LLM(model, kv_type=kv, progress=True)
                llm.generate([llm.tokenizer.bos_id or 0] * 2, SamplingParams(temperature=0, max_tokens=2,
                                                                             ignore_eos=True))
    if export_path:
        m = cache.export_cache(export_path)
        click.echo(f"exported tier {m['tier']} ({m['bytes'] / 1e6:.1f} MB) to {export_path}")
    if run_models or all_kernels:
        click.echo(f"kernels ready ({time.perf_counter() - t0:.1f} s; tier {cache.tier().name})")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of a table.")
def system(as_json):
    """The CPU, its ISA features, the kernel path, threads and Numba's threading layer."""
    from edgeinfer.system import format_system, system_info

    info = system_info()
    click.echo(json.dumps(info) if as_json else format_system(info))


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
@click.option("--max-body", "max_body_bytes", type=click.IntRange(1, None), default=4 * 1024 * 1024, show_default=True,
              help="Largest request body in bytes (413 past it).")
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
@engine_options
def serve(models, host, port, api_key, cors_origins, max_queue, request_timeout, read_timeout, max_body_bytes, max_seqs, threads,
          device, shutdown_timeout, drafts, speculate, draft_tokens, kv_type, max_context, memory_budget):
    """Serve MODELS (default: smollm2-135m-instruct) over an OpenAI-compatible HTTP API."""
    try:
        import prometheus_client  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise click.ClickException(f"the server needs the 'serve' extra ({e.name} is not installed): "
                                   f"pip install 'edgeinfer[serve]'") from None
    from edgeinfer.config import EngineConfig
    from edgeinfer.server.app import ServerConfig
    from edgeinfer.server.run import serve as run_server

    models = list(models) or [registry.DEFAULT_MODEL]
    paths = [registry.resolve(m, progress=True) for m in models]  # fail fast on unknown names; pull now
    if device != "cpu":  # fail now, not in the loading thread
        from edgeinfer.kernels import get_backend

        try:
            get_backend(device)
        except RuntimeError as e:
            raise click.ClickException(str(e)) from None
    base = EngineConfig(threads=threads, max_seqs=max_seqs, backend=device, kv_dtype=kv_type or "",
                        max_context=max_context)
    per_model = None
    if memory_budget:  # one budget for the whole process: every model's weights, KV and buffers
        per_model = dict(zip(models, budget_configs(paths, base, memory_budget)))
    speculation = serve_speculation(models, drafts, speculate, draft_tokens, device)
    cfg = ServerConfig(models=models, threads=threads, api_key=api_key, cors_origins=list(cors_origins),
                       max_queue=max_queue, request_timeout=request_timeout, read_timeout=read_timeout,
                       max_body_bytes=max_body_bytes,
                       max_seqs=max_seqs, backend=device, engine_config=base, model_configs=per_model,
                       speculation=speculation)
    sys.exit(run_server(cfg, host=host, port=port, shutdown_timeout=shutdown_timeout))


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
    from edgeinfer.gguf_file import GGUFFile

    ests = []
    for p in paths:
        with GGUFFile(p) as gf:
            ests.append(memory.estimate_file(gf, base))
    return memory.fit_budget(ests, [base] * len(paths), budget_mb, [os.path.basename(p) for p in paths])


@click.command("quantize-model")
@click.argument("src", type=click.Path(exists=True, dir_okay=False))
@click.argument("dst", type=click.Path(dir_okay=False))
@click.option("--type", "type_name", required=True,
              help="F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K, or the mixes Q4_K_S Q4_K_M Q5_K_S Q5_K_M.")
@click.option("--output-type", default=None, help="Type for output.weight (a tensor type, e.g. Q8_0).")
@click.option("--token-embedding-type", default=None, help="Type for token_embd.weight.")
@click.option("--pure", is_flag=True, help="Every quantizable tensor gets --type: no per-tensor mix rules.")
@click.option("--threads", type=click.IntRange(0, None), default=0, help="Threads (default: all cores).")
@click.option("--dry-run", is_flag=True, help="Print the per-tensor plan and the estimated size; write nothing.")
@click.option("--force", is_flag=True, help="Overwrite DST if it exists.")
def quantize_model_cmd(src, dst, type_name, output_type, token_embedding_type, pure, threads, dry_run, force):
    """Quantize the GGUF model SRC into DST (llama.cpp's per-tensor rules for the mixes)."""
    from edgeinfer.gguf_file import GGUFFile
    from edgeinfer.quant import mixes, tool

    type_name = type_name.upper()
    if type_name not in mixes.TYPES:
        raise click.ClickException(f"unknown type {type_name!r} (choose from {', '.join(mixes.TYPES)})")
    out_t = mixes.parse_type(output_type, mixes.TENSOR_TYPES) if output_type else None
    emb_t = mixes.parse_type(token_embedding_type, mixes.TENSOR_TYPES) if token_embedding_type else None
    with GGUFFile(src) as gf:
        if dry_run:
            p = tool.make_plan(gf, type_name, pure=pure, output_type=out_t, token_embedding_type=emb_t)
            width = max(len(x.name) for x in p)
            for x in p:
                click.echo(f"{x.name:<{width}}  {'x'.join(map(str, x.shape)):>14}  {x.src_type.name:>5} -> "
                           f"{x.dst_type.name:<5} {x.note}")
            est = tool.estimate(p)
            n = sum(int(np.prod(x.shape)) for x in p)
            click.echo(f"estimated tensor data: {est / 1e6:.1f} MB ({8 * est / n:.2f} bits per weight); "
                       f"source file {gf.file_size / 1e6:.1f} MB")
            return
        s = tool.quantize_model(gf, dst, type_name, pure=pure, output_type=out_t, token_embedding_type=emb_t,
                                threads=threads, force=force,
                                warn=lambda m: click.echo(f"warning: {m}", err=True))
    counts = {}
    for x in s.plan:
        counts[x.dst_type.name] = counts.get(x.dst_type.name, 0) + 1
    click.echo(f"{src} ({s.src_bytes / 1e6:.1f} MB) -> {dst} ({s.dst_bytes / 1e6:.1f} MB), "
               f"{s.bits_per_weight:.2f} bits per weight, {s.seconds:.1f} s; tensors: "
               + " ".join(f"{k}:{v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])))
