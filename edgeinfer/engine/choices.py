"""A request's n choices (OpenAI's `n`): one request, n sequences sampled on their own from one prompt.

The choices share the prompt's KV blocks through the prefix cache. Sequences admitted in the same step
would not: a block is registered for reuse only once its tokens are computed, so n sequences queued
together would each prefill the whole prompt. So choice 0 is queued at once and the others once it
gives its first output, in the step that computed (and registered) the prompt's full blocks: they
queue for the next step and prefill only the last, partly filled block. A prompt shorter than one block
has nothing to share, and all n are queued at once.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Callable


def choice_seed(seed: int | None, i: int) -> int | None:
    """Choice i's seed: the request's own for choice 0 (n=1 answers as before), one made of (seed, i)
    for the others, so a seeded response is reproducible and its choices differ; None stays None
    (each choice draws its own entropy)."""
    if seed is None or i == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}/{i}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # 63 bits, as the schema's seeds


class Choices:
    """The choices of one request with n > 1, while any is unfinished.

    params[i] and guides[i]: choice i's sampling parameters (its own seed) and its own grammar matcher
    (a matcher follows one sequence), or None. deferred: choices 1.. wait for choice 0's first output. media: the
    prompt's rows given as embeddings (sequence.MediaSpan), every choice's."""

    __slots__ = ("n", "params", "guides", "priority", "deferred", "open", "media")

    def __init__(self, n: int, params, guides: list, priority: int, deferred: bool):
        self.n = n
        self.params = [replace(params, seed=choice_seed(params.seed, i)) for i in range(n)]
        self.guides = guides
        self.priority = priority
        self.deferred = deferred
        self.open = n  # choices not finished yet
        self.media = ()


def follow(outs: list, requests: dict[str, Choices], fork: Callable[[list, str, Choices], None]) -> list:
    """A step's outputs (RequestOutputs) with the choices of `requests` (request id -> Choices) followed:
    choice 0's first output has fork(prompt ids, request id, choices) queue the deferred choices (its
    prompt's full blocks are registered now), or, when it failed (an error, an abort), ends them with its
    reason, before it; each output of these requests says whether its request is done, and a request
    done leaves `requests`."""
    followed = []
    for out in outs:
        choices = requests.get(out.request_id)
        if choices is None:
            followed.append(out)
            continue
        if out.index == 0 and choices.deferred:
            choices.deferred = False
            if out.finish_reason in ("error", "abort"):  # the others never start: they end as it did
                followed += [replace(out, delta_text="", new_token_ids=[], finished=True, num_output_tokens=0,
                                     logprobs=None, index=i, done=False) for i in range(1, choices.n)]
                choices.open -= choices.n - 1
            else:
                fork(out.prompt_token_ids, out.request_id, choices)
        choices.open -= out.finished
        out.done = not choices.open
        if out.done:
            del requests[out.request_id]
        followed.append(out)
    return followed
