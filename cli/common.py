"""Options and helpers several commands share: sampling, engine, constraint and speculation options, and
loading a model with them."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import click

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


def kv_type_options(f):
    """--kv-type, --kv-type-k and --kv-type-v, passed on as one `kv_type`: "T", or "K/V" where K's and V's
    differ (a side not given: --kv-type's, else the backend's default; config.kv_type_name)."""
    @functools.wraps(f)
    def combined(*args, kv_type_k=None, kv_type_v=None, **kw):
        kv = kw.get("kv_type")
        if kv_type_k or kv_type_v:
            kw["kv_type"] = f"{kv_type_k or kv or ''}/{kv_type_v or kv or ''}"
        return f(*args, **kw)

    for opt in reversed([
        click.option("--kv-type", type=click.Choice(KV_TYPES), default=None,
                     help="KV cache storage, K and V (default: f16 on the CPU, f32 on CUDA); of f16's bytes q8_0 "
                          "needs 53%, q5_1 38%, q5_0 34%, q4_1 31%, q4_0 and iq4_nl 28%."),
        click.option("--kv-type-k", type=click.Choice(KV_TYPES), default=None, help="K's storage alone."),
        click.option("--kv-type-v", type=click.Choice(KV_TYPES), default=None, help="V's storage alone."),
    ]):
        combined = opt(combined)
    return combined


def engine_options(f, budget: bool = True):
    """--kv-type (--kv-type-k, --kv-type-v), --max-context and (where a budget applies) --memory-budget."""
    opts = [
        click.option("--max-context", type=click.IntRange(0, None), default=0,
                     help="Tokens per sequence at most (default: the model's trained context, cut to what the "
                          "memory available allows)."),
    ]
    if budget:
        opts.append(click.option("--memory-budget", "memory_budget", type=click.FloatRange(0, None), default=0.0,
                                 help="MB the process may use: the KV cache and sequences are sized to fit "
                                      "(an error names the smallest budget that would)."))
    for opt in reversed(opts):
        f = opt(f)
    return kv_type_options(f)


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


def mmproj_option(f):
    """--mmproj: the model's vision projector."""
    return click.option("--mmproj", type=click.Path(exists=True, dir_okay=False), default=None, metavar="FILE",
                        help="The model's vision projector (an mmproj GGUF, as llama.cpp's --mmproj): prompts may "
                             "then hold images.")(f)


def lora_options(f, serve: bool = False):
    """--lora and --lora-scaled: LoRA adapters (llama.cpp's GGUF adapter files), as llama.cpp's options."""
    named = (" NAME=FILE: a model id of its own for requests ('model': NAME, vLLM's way), at scale 0 for the "
             "others; FILE alone: every request's (llama.cpp's --lora).") if serve else ""
    for opt in reversed([
        click.option("--lora", "loras", multiple=True, metavar="[NAME=]FILE",
                     help="A LoRA adapter (a GGUF adapter file, llama.cpp's) at scale 1; repeatable." + named),
        click.option("--lora-scaled", "loras_scaled", multiple=True, nargs=2, metavar="[NAME=]FILE SCALE",
                     help="A LoRA adapter at SCALE; repeatable."),
    ]):
        f = opt(f)
    return f


def lora_list(loras, loras_scaled, serve: bool = False) -> list:
    """(path, scale, name) for each --lora and --lora-scaled; on serve a named --lora starts at scale 0 (its
    requests name it)."""
    out = []
    for spec, scale in [(x, None) for x in loras] + list(loras_scaled):
        name, sep, path = spec.partition("=") if "=" in spec and not os.path.exists(spec) else ("", "", spec)
        if not os.path.isfile(path):
            raise click.BadParameter(f"{path}: no such file", param_hint="--lora")
        if scale is None:
            scale = 0.0 if serve and name else 1.0
        try:
            scale = float(scale)
        except ValueError:
            raise click.BadParameter(f"{scale!r} is not a number", param_hint="--lora-scaled") from None
        out.append((path, scale, name or Path(path).stem))
    names = [n for _, _, n in out]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise click.BadParameter(f"two adapters are named {dup!r}: name them (NAME=FILE)", param_hint="--lora")
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
                          "a draft adapts to its acceptance rate below that, lookup to how long its match is."),
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
         draft_tokens: int | None = None, compile_later: bool = False, mmproj: str | None = None,
         lora: list | None = None):
    """The model for a command; compile_later: a first run's first answers need not wait for the compiled
    step (chat, generate: kernels/cpu/background.py); mmproj: its vision projector."""
    from edgeinfer import LLM

    if threads < 0:
        raise click.BadParameter(f"--threads must be >= 0, got {threads}")
    return LLM(model, threads=threads, backend=device, kv_type=kv_type or "", max_context=max_context,
               memory_budget_mb=memory_budget, progress=True, draft=draft, speculate=speculate,
               draft_tokens=draft_tokens or 0, compile_later=compile_later, mmproj=mmproj, lora=lora or None)
