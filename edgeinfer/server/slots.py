"""llama.cpp's slots API: GET /slots lists a model's slots; POST /slots/{id_slot}?action=save|restore|erase saves
a slot's KV to a file in --slot-save-path ({"filename": ...}), reads one back, or forgets the slot's tokens.
A slot is a name for a conversation here (engine/slots.py says what it holds and how a restore is used); the
model is `?model=NAME`, or the one a request naming no model gets."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse

from ..engine import slots as S
from ..engine.loop import exclusive
from ..openai import protocol as P
from .scaffold import Call, decode, read_raw, route

ACTIONS = ("save", "restore", "erase")


def _loop(sm):
    if sm.loop is None:
        raise P.bad("model", f"{sm.name} is an embedding model: it has no slots")
    return sm.loop


def _filename(body) -> str:
    """The body's filename, a plain name inside --slot-save-path (llama.cpp's check: no folders, no '..')."""
    name = body.get("filename") if isinstance(body, dict) else None
    if not isinstance(name, str) or not name:
        raise P.bad("filename", "the body must be {\"filename\": NAME}")
    if (len(name.encode()) > 200 or name in (".", "..") or name.startswith(".") or name != name.strip()
            or any(c in name for c in "/\\:") or not name.isprintable()):
        raise P.bad("filename", f"invalid filename {name!r}: a plain file name, no folders, not starting with '.'")
    return name


@route()
async def list_slots(request: Request, call: Call):
    sm = await call.use(request.query_params.get("model"))
    loop = _loop(sm)
    return JSONResponse([{"id": s.id, "n_ctx": sm.llm.engine.max_context, "is_processing": s.processing,
                          "n_tokens": len(s.tokens)} for s in loop.slots.slots])


async def _body(request: Request):
    """The JSON body, whatever its Content-Type (llama.cpp reads it so); {} where there is none."""
    raw = await read_raw(request)
    return await decode(raw) if raw.strip() else {}


def _restore(engine, slot, tokens, stored, payload) -> int:
    n = S.place(engine, tokens, stored, payload)
    slot.tokens = tokens[:n]  # (on the compute thread, where requests in the slot finish)
    return n


@route()
async def slot_action(request: Request, call: Call):
    action = request.query_params.get("action")
    if action not in ACTIONS:
        raise P.bad("action", f"action must be one of {', '.join(ACTIONS)}, got {action!r}")
    try:
        id_slot = int(request.path_params["id_slot"])
    except ValueError:
        raise P.bad("id_slot", f"the slot id must be an integer, got {request.path_params['id_slot']!r}") from None
    folder = call.state.config.slot_save_path
    if action != "erase" and not folder:
        raise P.APIError(501, "this server does not save slots: start it with --slot-save-path DIR",
                         type_="not_supported_error")
    name = _filename(await _body(request)) if action != "erase" else ""
    sm = await call.use(request.query_params.get("model"))
    loop = _loop(sm)
    try:
        slot = loop.slots.slots[loop.slots.check(id_slot)]
    except ValueError as e:
        raise P.bad("id_slot", str(e)) from None
    if slot.processing:
        raise P.APIError(503, f"slot {id_slot} is busy: try again once its request has finished",
                         headers={"Retry-After": "1"})
    if action == "erase":
        n, slot.tokens = len(slot.tokens), []
        return JSONResponse({"id_slot": id_slot, "n_erased": n})
    engine = sm.llm.engine
    if engine.config.backend != "cpu":
        raise P.APIError(501, "saving and restoring slots is not on the CUDA backend yet", type_="not_supported_error")
    path = Path(folder) / name
    t0 = time.perf_counter()
    try:
        if action == "save":
            n, pieces = await asyncio.to_thread(exclusive, S.collect, engine, list(slot.tokens))  # copies: quick
            try:  # written outside the compute thread: the engines step on meanwhile
                Path(folder).mkdir(parents=True, exist_ok=True)
                size = await asyncio.to_thread(S.write, path, pieces)
            except OSError as e:
                raise P.APIError(500, f"could not write {name}: {e.strerror or e}") from None
            out = {"n_saved": n, "n_written": size, "timings": {"save_ms": (time.perf_counter() - t0) * 1e3}}
        else:
            tokens, stored, payload = await asyncio.to_thread(S.read, engine, path)  # checked before any step waits
            n = await asyncio.to_thread(exclusive, _restore, engine, slot, tokens, stored, payload)
            out = {"n_restored": n, "n_read": len(payload), "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3}}
    except S.NoRoom as e:
        raise P.APIError(503, str(e), headers={"Retry-After": "1"}) from None
    except S.SlotError as e:
        raise P.bad("filename", str(e)) from None
    return JSONResponse({"id_slot": id_slot, "filename": name, **out})
