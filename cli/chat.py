"""`edgeinfer chat`: a conversation with a model at the terminal (from a pipe: one turn per input line). A gpt-oss
model's harmony reply is shown by channel: its reasoning dimmed, its answer as it is (edgeinfer.harmony)."""

from __future__ import annotations

import json
import sys
import time

import dataclasses

import click

from edgeinfer import registry
from edgeinfer.harmony import HarmonyParser, is_harmony

from .common import (constraint_kwargs, constraint_options, load, lora_list, lora_options, make_params, mmproj_option,
                     sampling_options, speculation_options)


CHAT_HELP = "commands: /reset (new conversation), /system TEXT, /stats, /exit (or Ctrl-D); Ctrl-C stops an answer"
IMAGE_HELP = "; /image PATH (an image for your next message)"


@click.command()
@click.argument("model", default=registry.CHAT_MODEL)
@lambda f: sampling_options(f, temperature=0.2)  # small chat models stay on topic at low temperature
@constraint_options
@click.option("--system", "system_prompt", default=None, help="A system message to start with.")
@speculation_options
@mmproj_option
@lora_options
def chat(model, max_tokens, temperature, top_p, top_k, min_p, repeat_penalty, seed, stop, threads, device,
         kv_type, max_context, memory_budget, json_schema, regex, choice, grammar, system_prompt, draft, speculate,
         draft_tokens, mmproj, loras, loras_scaled):
    """Chat with MODEL (default: qwen2.5-coder-0.5b-instruct, pulled on first use). With a constraint
    (--json-schema, ...) every answer follows it."""
    params = make_params(max_tokens, temperature, top_p, top_k, min_p, repeat_penalty, seed, stop,
                         **constraint_kwargs(json_schema, regex, choice, grammar))
    interactive = sys.stdin.isatty()
    llm = load(model, threads, device, kv_type, max_context, memory_budget, draft, speculate, draft_tokens,
               compile_later=True, mmproj=mmproj, lora=lora_list(loras, loras_scaled))
    helps = CHAT_HELP + (IMAGE_HELP if mmproj else "")
    if interactive:
        _setup_readline()
        # a first run's kernel compile ends (its status line on stderr) before the prompt is shown, so the line
        # never writes into what the user types; the first answer would wait for it anyway
        llm.kernels.ready()
        click.echo(f"edgeinfer chat: {llm.path.name} ({llm.config.arch}, {llm.config.n_layer} layers). {helps}")
    harmony = is_harmony(llm.chat_template.source)
    if harmony:  # its channels need the control tokens' text
        params = dataclasses.replace(params, special_text=True)
    system = system_prompt
    history: list[dict] = []
    pending: list = []  # images for the next message (/image)
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
                history, pending = [], []
                click.echo("(conversation cleared)")
            elif cmd == "/system":
                system = arg.strip() or None
                history = []
                click.echo(f"(system message {'set' if system else 'cleared'}; conversation cleared)")
            elif cmd == "/stats":
                click.echo(json.dumps({**last, **llm.stats()}))
            elif cmd == "/image" and mmproj:
                _attach(arg.strip(), pending)
            else:
                click.echo(f"unknown command {cmd}; {helps}")
            continue
        content = [*({"type": "image", "image": im} for im in pending), {"type": "text", "text": line}] \
            if pending else line
        pending = []
        history.append({"role": "user", "content": content})
        messages = ([{"role": "system", "content": system}] if system else []) + history
        try:
            prompt_ids = llm.chat_prompt(messages)
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
        parser = HarmonyParser() if harmony else None
        try:
            for chunk in llm.stream(prompt_ids, params):
                first = first or time.perf_counter()
                n += len(chunk.token_ids)
                _show(chunk.text, parser, answer)
            _show("", parser, answer, True)
        except KeyboardInterrupt:
            if parser is not None:  # what the parser held back (a tag's start, a call) still counts
                _show("", parser, answer, True)
            click.echo(" [stopped]", nl=False)
        click.echo()
        end = time.perf_counter()
        last = {"prompt_tokens": len(prompt_ids), "completion_tokens": n, "ttft_s": round((first or end) - t0, 3),
                "decode_tok_s": round((n - 1) / (end - first), 2) if first and n > 1 and end > first else None}
        history.append({"role": "assistant", "content": "".join(answer)})


def _attach(path: str, pending: list) -> None:
    """/image PATH: the image read now (an error says what is wrong with it), sent with the next message."""
    from edgeinfer.images import ImageError, load

    if not path:
        click.echo("usage: /image PATH", err=True)
        return
    try:
        image = load(path)
    except ImageError as e:
        click.echo(f"error: {e}", err=True)
        return
    pending.append(image)
    w, h = image.size
    click.echo(f"(image {path}, {w}x{h}, goes with your next message)")


def _show(text: str, parser, answer: list, last: bool = False) -> None:
    # a reply's new text at the terminal, and its answer kept for the history: as it is, or a harmony reply's
    # pieces, the reasoning dimmed and left out of the history
    pieces = [("content", text)] if parser is None else parser.feed(text) + (parser.finish() if last else [])
    for kind, piece in pieces:
        if kind == "content":
            answer.append(piece)
        click.echo(click.style(piece, dim=True) if kind == "reasoning" else piece, nl=False)
    sys.stdout.flush()


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
