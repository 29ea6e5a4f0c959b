"""One served model in memory, or on its way in or out (ServedModel): its LLM, built on the compute
thread, and the engine loop that steps it; and giving an unloaded model's memory back to the system.
The model manager (server.models) decides when each is loaded and freed."""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from datetime import datetime

from ..config import EngineConfig
from ..openai import responses as R

DEFAULT_KEEP_ALIVE = 300.0  # seconds: Ollama's five minutes


class ServedModel:
    """One model in memory, or on its way in or out: loaded in a worker thread, then served through its
    engine loop. status: "loading", "loaded" or "unloading"; leases: requests holding it (or waiting for
    its load); keep_alive: seconds it stays once idle (negative: forever); pinned: never unloaded (a
    command-line model when --keep-alive was not given)."""

    def __init__(self, name: str, source: str, engine_config: EngineConfig, speculation: dict | None = None,
                 pinned: bool = False):
        self.name = name
        self.source = source
        self.engine_config = engine_config
        self.speculation = speculation or {}
        self.llm = None
        self.loop = None
        self.error: str | None = None
        self.created = R.now()
        self.status = "loading"
        self.pinned = pinned
        self.from_manifest = False  # a created model (edgeinfer.registry.created): its manifest's template applies
        self.unload_when_idle = False  # a request's keep_alive 0 on a pinned model: unloaded once idle
        self.leases = 0
        self.keep_alive = DEFAULT_KEEP_ALIVE
        self.last_used = time.monotonic()
        self.expires_at: datetime | None = None  # when idle with a timer running
        self.size = 0  # estimated bytes (describe)
        self.parts: dict = {}
        self.context_from = ""  # why its context is what it is (describe)
        self.details: dict = {}
        self.digest = ""
        self.task: asyncio.Task | None = None  # the load
        self.unload_task: asyncio.Task | None = None
        self.timer: asyncio.TimerHandle | None = None

    @property
    def ready(self) -> bool:
        return self.loop is not None or (self.llm is not None and self.llm.is_encoder and self.error is None)

    def load(self) -> None:
        """Build the LLM and start its engine loop (blocking: run in a worker thread); a failure is kept
        in `error`."""
        from ..engine.loop import EngineLoop, exclusive
        from ..llm import LLM

        try:
            # loaded on the compute thread, which will step it (edgeinfer.engine.loop says why)
            kw = dict(self.speculation)  # LLM's arguments (speculation, mmproj), and the server's own for images
            fetch_urls = kw.pop("allow_image_urls", False)
            made = None
            if self.from_manifest:  # a created model: its adapters load with it, its template replaces the file's
                from ..registry import created

                made = created.load(self.name)
                if made is not None and made.adapters:
                    kw["lora"] = [*kw.get("lora", ()), *made.adapters]
            self.llm = exclusive(LLM, self.source, engine_config=self.engine_config, progress=False, **kw)
            if self.llm.vision is not None:
                self.llm.vision.fetch_urls = fetch_urls
                self.llm.vision.compute = exclusive  # encodes on the compute thread, between engine steps
            if self.llm.is_encoder:  # an embedding model: no engine; /v1/embeddings computes in a worker thread
                return
            if made is not None and made.template:
                self.llm.chat_template = made.template
            self.llm.chat_template  # compiled now: a template that does not parse fails the load, not a request
            self.loop = EngineLoop(self.llm.engine, self.name).start()
        except Exception as e:  # reported by /health and every request waiting for this model
            self.llm, self.loop = None, None
            self.error = f"{type(e).__name__}: {e}"
            print(f"error: could not load model {self.name!r}: {e}", file=sys.stderr, flush=True)

    def stop(self) -> None:
        """Stop stepping its engine (blocking: a step under way finishes first)."""
        if self.loop is not None:
            self.loop.stop(timeout=5.0)


def give_back_memory() -> None:
    """Collect the unloaded model's cycles, then hand the freed heap back to the system: glibc keeps freed
    memory in its arenas (the weights were allocated in worker threads), so without malloc_trim the
    resident size would not go down."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: what the allocator keeps, it keeps
        pass
