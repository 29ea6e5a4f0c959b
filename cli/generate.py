"""`edgeinfer generate`: continue a prompt, streaming the text (or one JSON object with timing stats)."""

from __future__ import annotations

import json
import sys
import time

import click

from .common import (constraint_kwargs, constraint_options, load, lora_list, lora_options, make_params, mmproj_option,
                     sampling_options, speculation_options)


@click.command()
@click.argument("model")
@click.argument("prompt")
@sampling_options
@constraint_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: text and timing stats.")
@click.option("--special", is_flag=True, help="Parse special-token text (like <|im_start|>) in the prompt.")
@speculation_options
@mmproj_option
@lora_options
@click.option("--image", "images", multiple=True, type=click.Path(exists=True, dir_okay=False), metavar="PATH",
              help="An image for the prompt (needs --mmproj; repeatable): at each <__media__> in PROMPT, in order, "
                   "or before PROMPT where it has none.")
def generate(model, prompt, max_tokens, temperature, top_p, top_k, min_p, repeat_penalty, seed, stop, threads,
             device, kv_type, max_context, memory_budget, json_schema, regex, choice, grammar, as_json, special,
             draft, speculate, draft_tokens, mmproj, images, loras, loras_scaled):
    """Continue PROMPT with MODEL, streaming the text."""
    from edgeinfer.vision import MARKER

    if images and not mmproj:
        raise click.UsageError("--image needs the model's vision projector: --mmproj FILE")
    params = make_params(max_tokens, temperature, top_p, top_k, min_p, repeat_penalty, seed, stop,
                         **constraint_kwargs(json_schema, regex, choice, grammar))
    llm = load(model, threads, device, kv_type, max_context, memory_budget, draft, speculate, draft_tokens,
               compile_later=True, mmproj=mmproj, lora=lora_list(loras, loras_scaled))
    if images and MARKER not in prompt:
        prompt = MARKER * len(images) + prompt
    if images:  # the prompt's ids with the images' rows (a MediaPrompt): built once, read below
        prompt = llm.vision.prompt(prompt, list(images), parse_special=special)
    t0 = time.perf_counter()
    first = None
    text, ids, reason, prompt_ids = [], [], None, None
    try:
        for chunk in llm.stream(prompt, params, parse_special=special):
            first = first or time.perf_counter()
            prompt_ids = chunk.prompt_token_ids
            text.append(chunk.text)
            ids.extend(chunk.token_ids)
            reason = chunk.finish_reason or reason
            if not as_json:
                click.echo(chunk.text, nl=False)
                sys.stdout.flush()
    except KeyboardInterrupt:
        reason = "abort"
    end = time.perf_counter()
    if prompt_ids is None:  # stopped before the first chunk
        prompt_ids = prompt if images else llm.tokenize(prompt, add_bos=None, parse_special=special)
    n_prompt = len(prompt_ids)
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
