"""Reading the fields of Ollama's request bodies (docs/api.md of github.com/ollama/ollama) that every route
shares: the model's name, keep_alive, `options` and `format`, and the small typed readers the request
modules use. Pure functions: no HTTP.

Where Ollama and this server differ, the difference is decided here, once:
- `options` carry Ollama's sampling names; Ollama's defaults apply when absent (temperature 0.8, top_k 40,
  top_p 0.9); runner options (num_ctx, num_gpu, ...) are accepted and ignored; an option that would change
  the answer in a way this server cannot (mirostat, typical_p, tfs_z away from their neutral values) and
  an unknown option key are 400s naming them.
- Unknown top-level fields are ignored (as Ollama does: clients of different versions send different ones).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from . import protocol as P
from . import times

# -- small readers --------------------------------------------------------------------------------


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) or isinstance(v, float) and v.is_integer()


def is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def opt_field(body: dict, key: str, check, what: str, default=None):
    """body[key] when present and not null, checked by `check`; else default. A 400 naming the key."""
    v = body.get(key)
    if v is None:
        return default
    if not check(v):
        raise P.bad(key, f"'{key}' must be {what}, got {json.dumps(v)[:60]}")
    return v


def bool_field(body: dict, key: str, default=None):
    return opt_field(body, key, lambda v: isinstance(v, bool), "true or false", default)


def str_field(body: dict, key: str, default=None):
    return opt_field(body, key, lambda v: isinstance(v, str), "a string", default)


def parse_model(body, key: str = "model") -> str:
    """The model a body names, as this server calls it: Ollama's default tag ':latest' dropped
    ("smollm2:latest" is "smollm2"). Older clients send it as "name"."""
    if not isinstance(body, dict):
        raise P.APIError(400, "the request body must be a JSON object")
    name = body.get(key)
    if name is None and key == "model":
        name = body.get("name")
    if not isinstance(name, str) or not name:
        raise P.bad(key, f"'{key}' must be a model name, e.g. \"smollm2-135m-instruct\"")
    return name[:-len(":latest")] if name.endswith(":latest") else name


def keep_alive(body: dict) -> float | None:
    """keep_alive in seconds (times.parse_keep_alive: seconds, or a Go duration such as "5m"); any negative
    value is -1.0 (keep the model loaded). None when absent; a 400 naming keep_alive when unreadable."""
    v = body.get("keep_alive")
    if v is None:
        return None
    try:
        seconds = times.parse_keep_alive(v)
    except ValueError:
        raise P.bad("keep_alive", f"'keep_alive' must be seconds or a duration like \"5m\", \"1h\", \"0\" or "
                                  f"\"-1\", got {json.dumps(v)[:40]}") from None
    return -1.0 if seconds < 0 else seconds


# -- options --------------------------------------------------------------------------------------

# Ollama's option -> SamplingParams' field, and whether it is an integer
_SAMPLING = {"temperature": ("temperature", False), "top_p": ("top_p", False), "top_k": ("top_k", True),
             "min_p": ("min_p", False), "seed": ("seed", True), "repeat_penalty": ("repetition_penalty", False),
             "repeat_last_n": ("repeat_last_n", True), "presence_penalty": ("presence_penalty", False),
             "frequency_penalty": ("frequency_penalty", False)}
# Ollama's defaults where they differ from SamplingParams'
_DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}
# how the model is loaded and run: nothing here changes an answer, so they are accepted and ignored
_RUNNER = {"numa", "num_ctx", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all", "vocab_only",
           "use_mmap", "use_mlock", "embedding_only", "num_thread", "num_keep", "penalize_newline",
           "draft_num_predict", "mirostat_tau", "mirostat_eta"}  # the last two matter only with mirostat
# samplers this server does not have: accepted only at the value that leaves them off
_NEUTRAL = {"mirostat": 0, "typical_p": 1.0, "tfs_z": 1.0}
FIELD_TO_OPTION = {f: o for o, (f, _) in _SAMPLING.items()}


@dataclass
class Options:
    kwargs: dict  # SamplingParams keyword arguments
    num_predict: int | None  # None: to the context's end


def parse_options(body: dict) -> Options:
    """`options` as SamplingParams keyword arguments and num_predict. A 400 naming options.KEY for an
    unknown key, a value of the wrong type, or a sampler this server does not have."""
    opts = body.get("options")
    if opts is None:
        opts = {}
    if not isinstance(opts, dict):
        raise P.bad("options", "'options' must be an object of Ollama's model parameters, e.g. {\"temperature\": 0}")
    kwargs = dict(_DEFAULTS)
    num_predict = None
    for key, v in opts.items():
        where = f"options.{key}"
        if v is None:
            continue
        if key in _SAMPLING:
            name, integer = _SAMPLING[key]
            if not (is_int(v) if integer else is_num(v) and math.isfinite(v)):
                what = "an integer" if integer else "a number"
                raise P.bad(where, f"'{where}' must be {what}, got {json.dumps(v)[:40]}")
            v = int(v) if integer else float(v)
            if key == "seed":
                v = None if v < 0 else v  # Ollama's -1: a random seed
            elif key == "top_k":
                v = max(0, v)  # 0 or negative: off
            kwargs[name] = v
        elif key == "num_predict":
            if not is_int(v) or not (int(v) >= 1 or int(v) in (-1, -2)):
                raise P.bad(where, f"'{where}' must be a number of tokens >= 1, or -1 (to the context's end), "
                                   f"got {json.dumps(v)[:40]}")
            num_predict = int(v) if int(v) >= 1 else None
        elif key == "stop":
            stops = [v] if isinstance(v, str) else v
            if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
                raise P.bad(where, f"'{where}' must be a list of non-empty strings")
            kwargs["stop"] = tuple(stops)
        elif key in _NEUTRAL:
            if not is_num(v) or float(v) != _NEUTRAL[key]:
                raise P.bad(where, f"'{where}' is {json.dumps(v)[:40]}: this server has no {key} sampler "
                                   f"(only {_NEUTRAL[key]!r}, off, is accepted)")
        elif key in _RUNNER:
            continue
        else:
            raise P.bad(where, f"unknown option '{key}'; the sampling options are "
                               f"{', '.join(sorted([*_SAMPLING, 'num_predict', 'stop']))}")
    return Options(kwargs, num_predict)


def parse_format(body: dict) -> tuple[dict, str | None]:
    """`format` as SamplingParams' constraint: "json" (any JSON object) or a JSON schema; "" or absent: none."""
    f = body.get("format")
    if f is None or f == "":
        return {}, None
    if f == "json":
        return {"json_schema": {"type": "object"}}, "format"
    if isinstance(f, dict):
        return {"json_schema": f}, "format"
    raise P.bad("format", "'format' must be \"json\" or a JSON schema object")

