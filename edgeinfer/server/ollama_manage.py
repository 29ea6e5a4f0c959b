"""Ollama's model management on `edgeinfer serve`: POST /api/create, POST /api/copy, DELETE /api/delete, and the
blobs a create names (HEAD and POST /api/blobs/sha256:HEX: edgeinfer.registry.blobs).

A created model is a manifest over a model this server has (edgeinfer.registry.created): no weights are
copied, except that `quantize` writes the created model's own file with quantize-model's rules. What can
be created, copied onto or deleted:

- a name that is a catalog model, a command-line model or any other model file is never overwritten by a
  create or a copy (a 400); a created model is replaced, as Ollama replaces it, and unloaded if loaded;
- a create may name uploaded blobs: a GGUF model in `files` (in place of `from`), LoRA adapters in `adapters`
  (each read and checked against the base model's file before anything is saved; the created model loads with
  them, at scale 1, as Ollama's ADAPTER);
- delete removes a created model, or a downloaded model from the cache; never a model named on the command
  line; a .gguf file under --models-dir only with `serve --allow-delete`; never a file another created model
  is made over (a 400 naming them).

HTTP here; the bodies are read by edgeinfer.openai.ollama_create. Blocking work (reading folders and
manifests, quantizing, removing files) runs in worker threads.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..openai import ollama_create as OC
from ..openai import protocol as P
from ..registry import blobs, created
from .ollama import NDJSON, error, line, read_body_json
from .scaffold import Call, route


def _manager(call: Call):
    models = getattr(call.state, "models", None)
    if models is None or not hasattr(models, "forget"):
        raise P.APIError(501, "this server has no model manager: it cannot create or delete models")
    return models


def _check_target(models, name: str) -> None:
    """A name a create or a copy may write: not taken by any model but a created one (blocking)."""
    from .. import registry

    if name in models.command_line or registry.lookup(name) is not None:
        raise P.bad("model", f"{name!r} names a model this server has (a catalog or command-line model): choose "
                             "another name")
    try:
        mine = created.load(name) is not None
    except created.DamagedManifest:  # replaced by the new one
        mine = True
    if not mine and any(s.name == name for s in models.available()):
        raise P.bad("model", f"{name!r} names a model file this server has: choose another name")


def _base(models, name: str):
    """(the base servable, its created manifest or None) for a create's `from` or a copy's source."""
    src = models.find(name)
    return src, (created.load(src.name) if src.origin == "created" else None)


def _refuse_if_stood_on(name: str, what: str) -> None:
    users = created.standing_on(name)
    if users:
        raise P.bad("model", f"{name!r} cannot be {what}: {', '.join(users)} {'is' if len(users) == 1 else 'are'} "
                             f"made over its quantized file; delete {'it' if len(users) == 1 else 'them'} first")


def _blob(digest: str, field: str) -> Path:
    p = blobs.path(digest)
    if not p.is_file():
        raise P.bad(field, f"blob {digest} is not on this server: upload it first (POST /api/blobs/{digest})")
    return p


def _check_adapters(file: str, paths: list[str]) -> None:
    """Each adapter read and checked against the model file's tensors (a 400 naming what does not fit)."""
    from ..errors import EdgeInferError
    from ..gguf_file import GGUFFile
    from ..models.lora import check_file, read

    try:
        with GGUFFile(file) as gf:
            arch = gf.metadata.get("general.architecture")
            for p in paths:
                check_file(read(p, arch), gf)
    except (EdgeInferError, ValueError, OSError) as e:  # (gguf's own errors are ValueErrors)
        raise P.bad("adapters", f"adapter does not fit {Path(file).name}: {e}") from None


def _plan_create(models, req: OC.CreateRequest) -> created.Created:
    _check_target(models, req.name)
    _refuse_if_stood_on(req.name, "replaced")
    if req.base_blob is not None:  # a GGUF model uploaded as a blob
        path = _blob(req.base_blob, "files")
        _check_model_file(path)
        src, parent = None, None
        inherit = created.Created(req.name, req.base_blob, str(path))
    else:
        src, parent = _base(models, req.base)
        inherit = parent or created.Created(req.name, src.name, str(src.path))
    # (an adapter named twice, or one its parent has, once)
    adapters = [a for a in dict.fromkeys(str(_blob(d, "adapters")) for d in req.adapters) if a not in inherit.adapters]
    if adapters:
        _check_adapters(inherit.file, [*inherit.adapters, *adapters])
    return created.Created(
        name=req.name, base=inherit.base if src is None else src.name, file=inherit.file, own_file=False,
        adapters=[*inherit.adapters, *adapters],
        system=req.system if req.system is not None else inherit.system,
        template=req.template or inherit.template,
        parameters={**inherit.parameters, **req.parameters},
        messages=req.messages or inherit.messages, license=inherit.license + req.license,
        created_at=time.time())


def _check_model_file(path: Path) -> None:
    from ..errors import EdgeInferError
    from ..gguf_file import GGUFFile

    try:
        with GGUFFile(str(path)) as gf:
            kind = gf.metadata.get("general.type")
    except (EdgeInferError, ValueError, OSError) as e:
        raise P.bad("files", f"the uploaded file is not a model this server can read: {e}") from None
    if kind == "adapter":
        raise P.bad("files", "the uploaded file is a LoRA adapter: name it in 'adapters', over a model in 'from'")


def _quantize(c: created.Created, type_name: str) -> created.Created:
    """c with a file of its own, quantized from its base's: written beside the manifests under a temporary
    name (its base may be the very file it replaces: a created model quantized again), then renamed."""
    from ..gguf_file import GGUFFile
    from ..quant import tool

    dst = created.own_file(c.name)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f"{c.name}.new.gguf")
    try:
        with GGUFFile(c.file) as gf:
            tool.quantize_model(gf, tmp, type_name, force=True, progress=False, warn=lambda m: None)
    except tool.QuantizeError as e:
        tmp.unlink(missing_ok=True)
        raise P.bad("quantize", f"cannot quantize {Path(c.file).name} to {type_name}: {e}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, dst)
    return dataclasses.replace(c, file=str(dst), own_file=True)


def _save(c: created.Created) -> None:
    """Write c's manifest; an own file the model it replaces had and c does not use is removed after."""
    try:
        old = created.load(c.name)
    except created.DamagedManifest:
        old = None
    created.save(c)
    if old is not None and old.own_file and old.file != c.file:
        Path(old.file).unlink(missing_ok=True)


@route(error=error)
async def create(request: Request, call: Call):
    """Ollama's /api/create: `model` from `from`, with system, template, parameters, messages, license and
    quantize; streamed as Ollama streams it (status lines, then {"status": "success"})."""
    from ..quant import mixes

    body = await read_body_json(request)
    req = OC.parse_create(body, list(mixes.TYPES))
    models = _manager(call)
    c = await asyncio.to_thread(_plan_create, models, req)

    async def steps():
        nonlocal c
        yield {"status": "reading model metadata"}
        if req.quantize:
            yield {"status": f"quantizing {Path(c.file).name} to {req.quantize}"}
            c = await asyncio.to_thread(_quantize, c, req.quantize)
        if c.system is not None:
            yield {"status": "creating system layer"}
        yield {"status": "writing manifest"}
        await asyncio.to_thread(_save, c)
        models.forget(c.name)
        yield {"status": "success"}

    if req.stream:
        async def lines():
            try:
                async for obj in steps():
                    yield line(obj)
            except Exception as e:  # a quantize that fails mid-way: the stream says so; nothing is saved
                yield line({"error": f"create {req.name}: {e}"})

        return StreamingResponse(lines(), media_type=NDJSON)
    last = {}
    try:
        async for obj in steps():
            last = obj
    except P.APIError:
        raise
    except Exception as e:  # a disk that filled, say: nothing was saved
        raise P.APIError(500, f"create {req.name}: {e}") from None
    return JSONResponse(last)


def _copy(models, source: str, destination: str) -> None:
    _check_target(models, destination)
    _refuse_if_stood_on(destination, "replaced")
    src, manifest = _base(models, source)
    c = manifest or created.Created(destination, src.name, str(src.path))
    _save(dataclasses.replace(c, name=destination, own_file=False, created_at=time.time()))


@route(error=error)
async def copy(request: Request, call: Call):
    """Ollama's /api/copy: `destination` becomes a created model over `source`'s file, with source's
    defaults when source is a created model (no weights are copied). 200 with no body, as Ollama."""
    body = await read_body_json(request)
    source, destination = OC.parse_copy(body)
    models = _manager(call)
    await asyncio.to_thread(_copy, models, source, destination)
    models.forget(destination)
    return Response(status_code=200)


def _delete(models, name: str, allow_files: bool) -> None:
    from .. import registry

    if name in models.command_line:
        raise P.bad("model", f"model {name!r} is named on the server's command line: it is not deleted while "
                             "served (stop the server, then `edgeinfer rm`)")
    try:
        made = created.load(name)
    except created.DamagedManifest:  # nothing to serve: its manifest goes
        created.delete(name)
        return
    except Exception:  # not a name a manifest can have
        made = None
    if made is not None:  # (its base's file may be gone: it is deleted all the same)
        _refuse_if_stood_on(name, "deleted")
        created.delete(name)
        return
    src = models.find(name)
    path = Path(src.path)
    users = created.over(path)
    if users:
        raise P.bad("model", f"model {name!r} cannot be deleted: {', '.join(users)} "
                             f"{'is' if len(users) == 1 else 'are'} made over its file; delete "
                             f"{'it' if len(users) == 1 else 'them'} first")
    if src.origin in ("catalog", "cache", "registered"):
        registry.remove(src.name)
        models.registered.pop(src.name, None)
    elif src.origin == "models-dir":
        if not allow_files:
            raise P.APIError(403, f"model {name!r} is the file {path} under --models-dir: it is deleted only on a "
                                  "server started with --allow-delete", type_="permission_error")
        path.unlink()
    else:
        raise P.bad("model", f"model {name!r} ({src.origin}) cannot be deleted")


@route(error=error)
async def delete(request: Request, call: Call):
    """Ollama's /api/delete: a created model, a downloaded model, or (with --allow-delete) a file under
    --models-dir; unloaded first if loaded. 200 with no body; 404 for a model this server does not have."""
    body = await read_body_json(request)
    name = OC.parse_delete(body)
    models = _manager(call)
    await asyncio.to_thread(_delete, models, name, bool(getattr(call.state.config, "allow_delete", False)))
    models.forget(name)
    return Response(status_code=200)


@route(error=error)
async def blob_exists(request: Request, call: Call):
    """Ollama's HEAD /api/blobs/sha256:HEX: 200 where this server has the blob, else 404."""
    try:
        there = await asyncio.to_thread(blobs.exists, request.path_params["digest"])
    except blobs.BlobError as e:
        raise P.bad("digest", str(e)) from None
    return Response(status_code=200 if there else 404)


@route(error=error)
async def blob_upload(request: Request, call: Call):
    """Ollama's POST /api/blobs/sha256:HEX: the body kept as that blob when its sha256 is HEX (201; 400 and
    nothing kept otherwise, or when the client goes away mid-upload)."""
    try:
        up = await asyncio.to_thread(blobs.Upload, request.path_params["digest"])
    except blobs.BlobError as e:
        raise P.bad("digest", str(e)) from None
    except OSError as e:
        raise P.APIError(500, f"cannot write the blob: {e}") from None
    try:
        async for chunk in request.stream():
            if chunk:
                await asyncio.to_thread(up.write, chunk)
        await asyncio.to_thread(up.finish)
    except blobs.BlobError as e:
        raise P.bad("digest", str(e)) from None
    except BaseException:
        await asyncio.to_thread(up.abort)
        raise
    return Response(status_code=201)


ROUTES = [
    Route("/api/blobs/{digest}", blob_exists, methods=["HEAD"]),
    Route("/api/blobs/{digest}", blob_upload, methods=["POST"]),
    Route("/api/create", create, methods=["POST"]),
    Route("/api/copy", copy, methods=["POST"]),
    Route("/api/delete", delete, methods=["DELETE"]),
]
