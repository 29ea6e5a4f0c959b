"""Engines stepped in the background: requests arrive from any thread, each request's outputs go back
through its own callback (the server puts them on an asyncio queue).

One thread per process computes: the compute thread steps every EngineLoop's engine in turn and runs
the work handed to it by exclusive() (model loads, embeddings) between steps. It is one thread, not a
thread per model, because of how OpenMP (numba's threading layer) treats threads that start parallel
regions: each such thread gets its own team of worker threads, and once a process holds more OpenMP
workers than cores, libgomp stops spinning between regions and puts its workers to sleep after each
one. A decode step is hundreds of short parallel regions, so a model loaded in one thread and stepped
in another ran at about half speed on 2 cores (150,000 context switches in 10 s against 500).
"""

from __future__ import annotations

import itertools
import threading
import traceback
from collections import deque
from concurrent.futures import Future
from typing import Callable

from .llm_engine import LLMEngine, RequestOutput
from .slots import Slot, SlotTable

_ids = itertools.count()


class _ComputeThread:
    """The process's one compute thread (started on first use; a daemon)."""

    def __init__(self):
        self._loops: list[EngineLoop] = []
        self._calls: deque = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._threads_now = 0  # numba's thread count is per calling thread: set here, per engine

    def _ensure_started(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="edgeinfer-compute", daemon=True)
                self._thread.start()

    def in_thread(self) -> bool:
        return self._thread is not None and threading.current_thread() is self._thread

    def add(self, loop: "EngineLoop") -> None:
        with self._lock:
            self._loops.append(loop)
        self._ensure_started()
        self._wake.set()

    def remove(self, loop: "EngineLoop") -> None:
        with self._lock:
            if loop in self._loops:
                self._loops.remove(loop)

    def call(self, fn, *args, **kwargs) -> Future:
        """fn(*args, **kwargs) on the compute thread, between steps."""
        fut: Future = Future()
        if self.in_thread():
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as e:
                fut.set_exception(e)
            return fut
        with self._lock:
            self._calls.append((fut, fn, args, kwargs))
        self._ensure_started()
        self._wake.set()
        return fut

    def wake(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.clear()  # before looking: a wake-up that comes while we work is kept
            while True:
                with self._lock:
                    item = self._calls.popleft() if self._calls else None
                if item is None:
                    break
                fut, fn, args, kwargs = item
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(fn(*args, **kwargs))
                    except BaseException as e:
                        fut.set_exception(e)
                    self._threads_now = 0  # fn may have set numba's threads (a model load)
                item = fut = fn = args = kwargs = None  # a loaded model is not kept alive by this frame
            with self._lock:
                loops = list(self._loops)
            busy = False
            for loop in loops:
                if loop.engine.has_unfinished():
                    busy = True
                    if loop.threads != self._threads_now:
                        loop.engine.model.kb.set_threads(loop.threads)
                        self._threads_now = loop.threads
                    loop._step()
            loops = loop = None  # nor an engine stopped meanwhile (a model unloaded)
            if not busy:
                self._wake.wait(0.05)


_COMPUTE = _ComputeThread()


def exclusive(fn, *args, **kwargs):
    """fn(*args, **kwargs) run on the compute thread, between engine steps, and its result: for compute
    outside the engines that shares the cores and a model's buffers (embeddings), and for loading a
    model that an EngineLoop will step (its kernels then start their threads where they will run)."""
    return _COMPUTE.call(fn, *args, **kwargs).result()


class EngineLoop:
    def __init__(self, engine: LLMEngine, name: str = "engine"):
        from ..config import default_threads

        self.engine = engine
        self.name = name
        self.threads = engine.config.threads or default_threads()
        # per request: its callback, its choices not finished yet (add_request's n), its slot
        self._callbacks: dict[str, _Request] = {}
        self.slots = SlotTable(engine.max_seqs)  # llama.cpp's slots (engine/slots.py)
        self._lock = threading.Lock()
        self.steps = 0
        self.last_error: str | None = None

    def start(self) -> "EngineLoop":
        _COMPUTE.add(self)
        return self

    @property
    def num_active(self) -> int:
        with self._lock:
            return len(self._callbacks)

    def submit(self, prompt_ids, params, on_output: Callable[[RequestOutput], None], priority: int = 0,
               guide=None, n: int = 1, slot: int | None = None) -> str:
        """Queue a request (of n choices: on_output gets each one's outputs, told apart by their index);
        raises ValueError at once for a prompt the engine cannot take. slot: the slot whose tokens its prompt
        and choice 0's answer become (None or -1: the least recently used idle one)."""
        rid = f"req-{next(_ids)}"
        req = _Request(on_output, n, self.slots.assign(slot), prompt_ids)
        with self._lock:
            self._callbacks[rid] = req  # before the engine can produce anything for it
        try:
            self.engine.add_request(prompt_ids, params, request_id=rid, priority=priority, guide=guide, n=n)
        except BaseException:
            with self._lock:
                self._callbacks.pop(rid, None)
            self.slots.finish(req.slot, None)
            raise
        _COMPUTE.wake()
        return rid

    def slot_of(self, request_id: str) -> int:
        """The slot a request in flight runs in (-1 once it is done)."""
        with self._lock:
            req = self._callbacks.get(request_id)
        return req.slot.id if req is not None else -1

    def abort(self, request_id: str) -> None:
        """Stop a request and free its KV blocks at the next step (within one step's time)."""
        self.engine.abort(request_id)
        _COMPUTE.wake()

    def stop(self, timeout: float = 5.0) -> None:
        """Step this engine no more (a step under way finishes first, within timeout)."""
        _COMPUTE.remove(self)
        try:
            _COMPUTE.call(lambda: None).result(timeout)
        except Exception:
            pass

    def _deliver(self, out: RequestOutput) -> None:
        with self._lock:
            req = self._callbacks.pop(out.request_id, None) if out.done else self._callbacks.get(out.request_id)
            if req is not None and out.finished:
                req.left.discard(out.index)
        if req is not None:
            if out.index == 0:
                req.tokens += out.new_token_ids
                if out.finished:
                    self.slots.finish(req.slot, req.tokens)
            try:
                req.on_output(out)
            except Exception:  # a consumer's bug must not stop the engine for everyone else
                traceback.print_exc()

    def _step(self) -> None:
        """One step of this engine, on the compute thread; an error fails the requests in flight and
        the engine goes on serving new ones."""
        try:
            outs = self.engine.step()
            self.steps += 1
        except Exception as e:
            self.last_error = f"{type(e).__name__}: {e}"
            traceback.print_exc()
            with self._lock:
                failed = [(rid, sorted(req.left)) for rid, req in self._callbacks.items()]
            for rid, left in failed:  # every choice not finished yet, those the engine has not started too
                self.engine.abort(rid)
                for i in left:
                    self._deliver(RequestOutput(rid, "", [], True, "error", index=i, done=i == left[-1]))
            try:
                self.engine.step()  # drain the aborts so their blocks are freed
            except Exception:
                pass
            return
        for out in outs:
            self._deliver(out)


class _Request:
    """A submitted request as its loop tracks it: the callback, the choices not finished yet, its slot and the
    tokens it leaves there (the prompt, then choice 0's output)."""

    __slots__ = ("on_output", "left", "slot", "tokens")

    def __init__(self, on_output, n: int, slot: Slot, prompt_ids):
        self.on_output, self.left, self.slot, self.tokens = on_output, set(range(n)), slot, list(prompt_ids)
