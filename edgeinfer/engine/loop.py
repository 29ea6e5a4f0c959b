"""The engine in a background thread: requests arrive from any thread, each request's outputs go
back through its own callback (the server puts them on an asyncio queue)."""

from __future__ import annotations

import itertools
import threading
import traceback
from typing import Callable

from .llm_engine import LLMEngine, RequestOutput

_ids = itertools.count()
# One step at a time across all loops (several served models): they share the cores, and numba's
# fallback threading layer (workqueue) must not run parallel kernels from two threads at once.
_STEP_LOCK = threading.Lock()


def exclusive(fn, *args, **kwargs):
    """Run fn while no engine step runs (any model's): for compute outside the engines that shares the
    cores and a model's buffers, such as embeddings."""
    with _STEP_LOCK:
        return fn(*args, **kwargs)


class EngineLoop:
    def __init__(self, engine: LLMEngine, name: str = "engine"):
        self.engine = engine
        self._callbacks: dict[str, Callable[[RequestOutput], None]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"edgeinfer-{name}", daemon=True)
        self.steps = 0
        self.last_error: str | None = None

    def start(self) -> "EngineLoop":
        self._thread.start()
        return self

    @property
    def num_active(self) -> int:
        with self._lock:
            return len(self._callbacks)

    def submit(self, prompt_ids, params, on_output: Callable[[RequestOutput], None], priority: int = 0,
               guide=None) -> str:
        """Queue a request; raises ValueError at once for a prompt the engine cannot take."""
        rid = f"req-{next(_ids)}"
        with self._lock:
            self._callbacks[rid] = on_output  # before the engine can produce anything for it
        try:
            self.engine.add_request(prompt_ids, params, request_id=rid, priority=priority, guide=guide)
        except BaseException:
            with self._lock:
                self._callbacks.pop(rid, None)
            raise
        self._wake.set()
        return rid

    def abort(self, request_id: str) -> None:
        """Stop a request and free its KV blocks at the next step (within one step's time)."""
        self.engine.abort(request_id)
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout)

    def _deliver(self, out: RequestOutput) -> None:
        with self._lock:
            cb = self._callbacks.pop(out.request_id, None) if out.finished else self._callbacks.get(out.request_id)
        if cb is not None:
            try:
                cb(out)
            except Exception:  # a consumer's bug must not stop the engine for everyone else
                traceback.print_exc()

    def _run(self) -> None:
        while not self._stopping:
            if not self.engine.has_unfinished():
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            try:
                with _STEP_LOCK:
                    outs = self.engine.step()
                self.steps += 1
            except Exception as e:  # fail the requests in flight, keep serving new ones
                self.last_error = f"{type(e).__name__}: {e}"
                traceback.print_exc()
                with self._lock:
                    failed = list(self._callbacks)
                for rid in failed:
                    self.engine.abort(rid)
                    self._deliver(RequestOutput(rid, "", [], True, "error"))
                try:
                    self.engine.step()  # drain the aborts so their blocks are freed
                except Exception:
                    pass
                continue
            for out in outs:
                self._deliver(out)
