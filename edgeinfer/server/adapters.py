"""LoRA adapters over HTTP: a served model's adapters as model ids of their own (vLLM's convention: a request
naming adapter NAME runs its base model with that adapter alone, at scale 1: scaffold.resolve), each request's own choice
(llama.cpp's "lora": [{"id", "scale"}], parsed with the sampling fields), and llama.cpp's /lora-adapters: GET
lists the adapters with their scales, POST sets the scales of requests that choose none (an adapter left out of
the list: 0)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

from ..openai import protocol as P
from .scaffold import Call, read_json, route


def adapter_ids(config, command_line: dict) -> dict:
    """adapter name -> the served model it adapts, for the command line's models' --lora adapters."""
    out = {}
    for name, source in command_line.items():
        for _, _, adapter in ((config.speculation or {}).get(source) or {}).get("lora", ()):
            out[adapter] = name
    return out


def _adapters(sm):
    """The served model's LoraSet, or None (no adapters: an empty list, as llama.cpp's)."""
    return getattr(sm.llm.model, "lora", None) if sm.llm is not None else None


def _listing(ls) -> list:
    if ls is None:
        return []
    return [{"id": i, "name": n, "path": str(a.path), "scale": float(f"{s:.7g}")}  # (float32 kept)
            for i, (n, a, s) in enumerate(zip(ls.names, ls.adapters, ls.scales))]


@route()
async def list_adapters(request: Request, call: Call):
    """GET /lora-adapters[?model=NAME]: [{id, name, path, scale}] (llama.cpp's, with the name requests use)."""
    sm = await call.use(request.query_params.get("model"))
    return JSONResponse(_listing(_adapters(sm)))


@route()
async def set_adapters(request: Request, call: Call):
    """POST /lora-adapters[?model=NAME] with [{"id", "scale"}]: the scales of requests that choose no adapters
    (an adapter left out: 0); requests already running keep theirs. Answers the new listing."""
    body = await read_json(request)
    if not isinstance(body, list) or not all(isinstance(x, dict) and set(x) == {"id", "scale"} for x in body):
        raise P.bad("lora", 'the body must be a list of {"id": adapter index, "scale": number} objects')
    sm = await call.use(request.query_params.get("model"))
    ls = _adapters(sm)
    new = [0.0] * (len(ls.adapters) if ls is not None else 0)
    for x in body:
        i, s = x["id"], x["scale"]
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(new):
            raise P.bad("id", f"no adapter {i!r} (ids 0 to {len(new) - 1})" if new else
                        f"no adapter {i!r}: model {sm.name!r} has none (serve it with --lora)")
        if isinstance(s, bool) or not isinstance(s, (int, float)) or s != s or abs(s) == float("inf"):
            raise P.bad("scale", f"the scale of adapter {i} must be a finite number, got {s!r}")
        new[i] = float(s)
    if ls is not None:
        ls.scales[:] = new  # in place: the array the model's rows read their defaults from
    return JSONResponse(_listing(ls))
