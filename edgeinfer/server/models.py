"""The served models in memory, and when each is loaded and freed (ModelManager). What can be served
(lookup, paths, estimates) is server.servable's, one model in memory server.served's.

A model is loaded when a request first names it (or at start, for the models named on the command
line), and unloaded once it has been idle for its keep-alive, Ollama's way. Idle means no lease held:
a request holds its model from scaffold.use_model until its response, streamed or not, is done.

Everything here runs on the server's event loop, so the tables need no lock: a model's state changes
between awaits, never during one. What blocks (reading a file's header for the estimate, building the
LLM on the compute thread, stopping an engine loop, collecting the garbage) runs in worker threads. A
model is in `models` from the moment a load starts ("loading") until its memory is given back
("unloading" ends), so it is loaded once however many requests ask, its estimate counts against the
memory budget while it loads, and no request ever sees a half-loaded or half-freed model: it waits for
the load, or for the unload and then loads it again.

Under a memory budget the loaded models together, plus the runtime, must fit it: loading one that
does not fit evicts the least recently used idle models first. A model that could never fit is a 507
(Insufficient Storage); one that would fit once busy models are idle again is a 503 with Retry-After.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from .. import memory, registry
from ..config import EngineConfig
from ..errors import EdgeInferError
from ..openai import protocol as P
from ..openai.times import rfc3339
from .servable import Servable, Servables, describe, digest
from .served import DEFAULT_KEEP_ALIVE, ServedModel, give_back_memory

FOREVER = datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc)  # expires_at of a model kept loaded


def _retrieve(task: asyncio.Task) -> None:
    """A finished task's exception counts as seen (its waiters, if any, got it already)."""
    if not task.cancelled():
        task.exception()


class ModelManager(Servables):
    """The server's models (ServerState.models): what can be served on demand (Servables), what is in memory
    (`models`: name -> ServedModel), leases, keep-alive timers and the memory budget."""

    def __init__(self, config, engine_config: EngineConfig):
        super().__init__(config)
        self.config = config
        self.engine_config = engine_config
        self.models: dict[str, ServedModel] = {}
        self.default_keep_alive = DEFAULT_KEEP_ALIVE if config.keep_alive is None else config.keep_alive
        self.budget = int((config.memory_budget_mb or 0) * memory.MB)
        self.startup_pending: set[str] = set()  # command-line models not yet through their first load
        self.startup_errors: dict[str, str] = {}  # ... and those whose last load failed
        self._digests: dict[tuple, str] = {}
        from .adapters import adapter_ids

        self.adapters = adapter_ids(config, self.command_line)  # adapter name -> the model it adapts
        self._loop: asyncio.AbstractEventLoop | None = None
        for name, source in self.command_line.items():
            self.models[name] = self._new(name, source)  # "loading" from the start: /health says so
            self.startup_pending.add(name)

    # -- what is in memory -------------------------------------------------------------------------------

    def _new(self, name: str, source: str) -> ServedModel:
        config = (self.config.model_configs or {}).get(source, self.engine_config)
        spec = (self.config.speculation or {}).get(source, self.config.on_demand_speculation)
        pinned = name in self.command_line and self.config.keep_alive is None
        try:  # a catalog name or hf.co reference given on the command line: its file (already pulled by serve)
            source = str(registry.resolve(source, pull_missing=False, progress=False))
        except EdgeInferError:
            pass  # the load reports it
        sm = ServedModel(name, source, config, spec, pinned=pinned)
        sm.keep_alive = self.default_keep_alive
        return sm

    # -- leases ------------------------------------------------------------------------------------

    async def acquire(self, name: str | None, keep_alive: float | None, timeout: float):
        """The named model (None: default_name()), loaded if need be, with one more lease on it: (sm, release).
        Waits for a load or an unload under way, up to `timeout` seconds (a 504 past it)."""
        self._loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout
        name = self.default_name() if name is None else name
        while True:
            sm = self.models.get(name)
            if sm is None:
                src = await asyncio.to_thread(self.find, name)  # it may read folders: not on the event loop
                sm = self.models.get(src.name)  # checked again after the await: one load, however many ask
                if sm is not None and Path(sm.source).expanduser().resolve() != src.path.resolve():
                    raise P.APIError(409, f"a different model named {src.name!r} is loaded (from {sm.source}); "
                                     "name that one, or wait until it is unloaded", param="model")
                if sm is None:
                    sm = self._start_load(src)
            if sm.status == "unloading":
                await self._wait(sm.unload_task, sm, deadline, "unloaded")
                continue  # gone now: loaded again on the next turn
            sm.leases += 1  # held while waiting, so a fresh load is not unloaded before its waiters use it
            if sm.timer is not None:
                sm.timer.cancel()
                sm.timer = None
            if not sm.pinned:
                sm.keep_alive = self.default_keep_alive if keep_alive is None else float(keep_alive)
            else:  # `ollama stop` (keep_alive 0) unloads a command-line model too, once idle (the latest request's
                # say, as for any model; loaded again, and kept again, by the next request)
                sm.unload_when_idle = keep_alive is not None and float(keep_alive) == 0
            if sm.status == "loading":
                try:
                    await self._wait(sm.task, sm, deadline, "loaded")
                except BaseException:
                    self._release(sm)
                    raise
            sm.last_used = time.monotonic()
            return sm, self._releaser(sm)

    async def _wait(self, task, sm, deadline, what: str) -> None:
        left = deadline - time.monotonic()
        try:
            await asyncio.wait_for(asyncio.shield(task), max(0.0, left))
        except asyncio.TimeoutError:
            raise P.APIError(504, f"model {sm.name!r} was not {what} within the request timeout of "
                             f"{self.config.request_timeout:g} s") from None

    def _releaser(self, sm: ServedModel):
        def release(_sm=None):  # from a worker thread too: the tables are the event loop's
            loop = self._loop
            if loop is not None and not _on(loop):
                loop.call_soon_threadsafe(self._release, sm)
            else:
                self._release(sm)
        return release

    def _release(self, sm: ServedModel) -> None:
        sm.leases = max(0, sm.leases - 1)
        sm.last_used = time.monotonic()
        if sm.leases == 0 and sm.status == "loaded":
            self._schedule_expiry(sm)

    def _schedule_expiry(self, sm: ServedModel) -> None:
        """An idle model's keep-alive starts: forever (pinned or negative), now (0), or a timer."""
        if sm.timer is not None:
            sm.timer.cancel()
            sm.timer = None
        sm.expires_at = None
        if sm.unload_when_idle:
            self._start_unload(sm)
            return
        if sm.pinned or sm.keep_alive < 0:
            return
        if sm.keep_alive == 0:
            self._start_unload(sm)
            return
        sm.expires_at = datetime.now(timezone.utc) + _seconds(sm.keep_alive)
        sm.timer = asyncio.get_running_loop().call_later(sm.keep_alive, self._expire, sm)

    def _expire(self, sm: ServedModel) -> None:
        sm.timer = None
        if sm.status == "loaded" and sm.leases == 0 and self.models.get(sm.name) is sm:
            self._start_unload(sm)

    # -- loading and unloading ---------------------------------------------------------------------

    def start(self) -> None:
        """Load the command-line models, one after the other, in the background (/health says loading)."""
        self._loop = asyncio.get_running_loop()
        prev = None
        for name in self.command_line:
            sm = self.models[name]
            sm.task = self._loop.create_task(self._load(sm, after=prev, budget=False))
            sm.task.add_done_callback(_retrieve)
            prev = sm.task

    def _start_load(self, src: Servable) -> ServedModel:
        sm = self._new(src.name, str(src.path))
        sm.from_manifest = src.origin == "created"  # its manifest's template, if any, replaces the file's (at load)
        self.models[sm.name] = sm
        sm.task = asyncio.get_running_loop().create_task(self._load(sm))
        sm.task.add_done_callback(_retrieve)
        return sm

    async def _load(self, sm: ServedModel, after=None, budget: bool = True) -> None:
        """Estimate, make room under the budget, load; on any failure the model is dropped (a later
        request may try again) and every request waiting for it gets the error."""
        if after is not None:
            await asyncio.wait([after])
        try:
            try:
                held = sum(m.parts.get("kv", 0) for m in self.models.values() if m is not sm)  # (pools, untouched)
                info = await asyncio.to_thread(describe, sm.source, sm.engine_config, not self.budget, held,
                                               sm.speculation.get("mmproj", ""))
            except Exception as e:
                raise P.APIError(500, f"model {sm.name!r} failed to load: {type(e).__name__}: {e}") from None
            sm.size, sm.details = info["size"], info["details"]
            sm.parts = {k: info[k] for k in ("weights", "buffers", "kv")}
            if not sm.engine_config.max_context:  # the context counted is the one it gets
                sm.engine_config = replace(sm.engine_config, max_context=info["max_context"])
            sm.context_from = info["context_from"]
            if budget and self.budget:
                await self._make_room(sm)
            await asyncio.to_thread(sm.load)
            if sm.error:
                raise P.APIError(500, f"model {sm.name!r} failed to load: {sm.error}")
        except BaseException as e:
            if self.models.get(sm.name) is sm:
                del self.models[sm.name]
            if sm.loop is not None:
                await asyncio.to_thread(sm.stop)
            sm.llm = sm.loop = None
            if sm.name in self.startup_pending:
                self.startup_errors[sm.name] = sm.error or str(e)
            self.startup_pending.discard(sm.name)
            raise
        self.startup_errors.pop(sm.name, None)
        sm.status = "loaded"
        sm.last_used = time.monotonic()
        ctx = f"; context {sm.llm.engine.max_context} tokens: {sm.context_from}" if sm.llm.engine else ""
        print(f"loaded {sm.name} ({sm.size / memory.MB:.0f} MB estimated{ctx})", file=sys.stderr, flush=True)
        if sm.name in self.startup_pending:
            self.startup_pending.discard(sm.name)
            if not self.startup_pending and not self.startup_errors:
                print(f"ready: serving {', '.join(self.command_line)}", file=sys.stderr, flush=True)
        if sm.leases == 0:
            self._schedule_expiry(sm)
        # /api/ps's digest: hashing a big file takes a while, so not before the model serves
        asyncio.get_running_loop().create_task(self._fill_digest(sm)).add_done_callback(_retrieve)

    async def _fill_digest(self, sm: ServedModel) -> None:
        st = Path(sm.source).stat()
        key = (str(Path(sm.source).resolve()), st.st_size, st.st_mtime_ns)
        if key not in self._digests:
            self._digests[key] = await asyncio.to_thread(digest, sm.source)
        sm.digest = self._digests[key]

    def forget(self, name: str) -> None:
        """A model whose definition changed or is gone (Ollama's create over it, copy onto it, delete):
        unloaded now if idle, else once its last request is done; the next request loads it afresh."""
        sm = self.models.get(name)
        if sm is None or sm.status == "unloading":
            return
        if sm.status == "loaded" and sm.leases == 0:
            self._start_unload(sm)
        else:
            sm.unload_when_idle = True

    def _start_unload(self, sm: ServedModel) -> None:
        if sm.timer is not None:
            sm.timer.cancel()
            sm.timer = None
        sm.status = "unloading"
        sm.expires_at = None
        sm.unload_task = asyncio.get_running_loop().create_task(self._unload(sm))
        sm.unload_task.add_done_callback(_retrieve)

    async def _unload(self, sm: ServedModel) -> None:
        """Stop its engine loop, drop the LLM and give its memory back; it stays in `models` (counted
        against the budget, and requests for it wait) until that is done."""
        try:
            await asyncio.to_thread(sm.stop)
        finally:
            sm.llm = sm.loop = None
            await asyncio.to_thread(give_back_memory)
            if self.models.get(sm.name) is sm:
                del self.models[sm.name]
            print(f"unloaded {sm.name}", file=sys.stderr, flush=True)

    def _held(self, sm: ServedModel) -> bool:
        """Whether a model holds its memory whatever a new load needs (anything but an idle, unpinned,
        loaded model, or one already on its way out)."""
        return sm.status != "unloading" and not (sm.status == "loaded" and sm.leases == 0 and not sm.pinned)

    async def _make_room(self, sm: ServedModel) -> None:
        """Evict least recently used idle models until `sm` fits the budget, or say why it cannot."""
        others = [m for m in self.models.values() if m is not sm]
        need = memory.RUNTIME_BYTES + sm.size
        pinned = sum(m.size for m in others if m.pinned)
        if need + pinned > self.budget:
            raise P.APIError(507, self._too_big(sm, [m for m in others if m.pinned], "stay loaded"),
                             type_="insufficient_storage", code="memory_budget")
        held = [m for m in others if self._held(m)]
        if need + sum(m.size for m in held) > self.budget:
            raise P.APIError(503, self._too_big(sm, held, "are in use or loading") + "; try again when they are idle",
                             headers={"Retry-After": "2"})
        idle = sorted((m for m in others if not self._held(m) and m.status == "loaded"), key=lambda m: m.last_used)
        used = need + sum(m.size for m in others if m.status != "unloading")
        for m in idle:
            if used <= self.budget:
                break
            print(f"evicting {m.name} (idle) to make room for {sm.name} under the memory budget", file=sys.stderr,
                  flush=True)
            self._start_unload(m)
            used -= m.size
        going = [m.unload_task for m in others if m.status == "unloading" and m.unload_task is not None]
        if going:
            await asyncio.wait(going)

    def _too_big(self, sm: ServedModel, held: list[ServedModel], how: str) -> str:
        mb = memory.MB
        p = sm.parts
        parts = [f"runtime {memory.RUNTIME_BYTES / mb:.0f} MB"]
        if held:
            parts.append(f"models that {how}: " + ", ".join(f"{m.name} {m.size / mb:.1f} MB" for m in held))
        return (f"model {sm.name!r} needs about {sm.size / mb:.1f} MB (weights {p.get('weights', 0) / mb:.1f} MB + "
                f"buffers {p.get('buffers', 0) / mb:.1f} MB + KV {p.get('kv', 0) / mb:.1f} MB), more than the memory "
                f"budget of {self.config.memory_budget_mb:g} MB leaves ({'; '.join(parts)})")

    def stop(self) -> None:
        """Server shutdown: stop every engine loop (blocking)."""
        for sm in list(self.models.values()):
            if sm.timer is not None:
                sm.timer.cancel()
            if sm.loop is not None:
                sm.loop.stop(timeout=2.0)

    # -- what is loaded, for /api/ps, /v1/models, /health and /metrics -----------------------------

    def loaded(self) -> list[ServedModel]:
        return [sm for sm in self.models.values() if sm.status == "loaded"]

    def expires(self, sm: ServedModel) -> datetime:
        """When an idle model will be unloaded; for a busy one, its keep-alive from now; FOREVER when kept."""
        if sm.pinned or sm.keep_alive < 0:
            return FOREVER
        if sm.leases == 0 and sm.expires_at is not None:
            return sm.expires_at
        return datetime.now(timezone.utc) + _seconds(sm.keep_alive)

    def ps(self) -> dict:
        """Ollama's GET /api/ps body: the models in memory."""
        on_gpu = any(sm.engine_config.backend == "cuda" for sm in self.models.values())
        return {"models": [{"name": sm.name, "model": sm.name, "size": sm.size, "digest": sm.digest,
                            "details": sm.details, "expires_at": rfc3339(self.expires(sm)),
                            "size_vram": sm.size if on_gpu and sm.engine_config.backend == "cuda" else 0}
                           for sm in self.loaded()]}


def _seconds(s: float):
    from datetime import timedelta

    return timedelta(seconds=min(s, 1e9))


def _on(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


__all__ = ["FOREVER", "ModelManager"]
