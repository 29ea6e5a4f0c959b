"""Compile progress: what Numba is compiling, shown while it happens (a first run, or a new model's
weight types, compiles the kernels that model needs into Numba's on-disk cache; later runs load them)."""

from __future__ import annotations

import sys
import threading
import time

_installed = False
_lock = threading.Lock()


class _Progress:
    """A numba "numba:compile" event listener: one status line on stderr while any compile runs, naming
    the function being compiled, the count so far and the seconds spent."""

    def __init__(self, stream):
        self.stream = stream
        self.depth = 0
        self.count = 0
        self.t0 = 0.0
        self.last = 0.0
        self.quiet = False

    def on_start(self, name: str) -> None:
        from . import parallel_compile

        if self.depth == 0:
            # while worker processes compile, their status line is the one shown
            self.quiet = parallel_compile.active()
            self.t0 = time.perf_counter()
            self.count = 0
        self.depth += 1
        self.count += 1
        now = time.perf_counter()
        if not self.quiet and (now - self.last > 0.2 or self.count == 1):
            self.last = now
            self.stream.write(f"\rcompiling kernels for this model (first run only; cached for later runs): "
                              f"{self.count} functions, {now - self.t0:.0f} s [{name}]\x1b[K")
            self.stream.flush()

    def on_end(self) -> None:
        self.depth -= 1
        if self.depth == 0 and not self.quiet:
            self.stream.write(f"\rcompiled {self.count} kernel functions in {time.perf_counter() - self.t0:.1f} s"
                              f"\x1b[K\n")
            self.stream.flush()


def show_progress(stream=None) -> None:
    """From now on, say on stderr (or `stream`) what Numba compiles while it compiles. Idempotent."""
    global _installed
    with _lock:
        if _installed:
            return
        from numba.core import event

        progress = _Progress(stream or sys.stderr)

        class Listener(event.Listener):
            def on_start(self, ev):
                fn = getattr(ev.data.get("dispatcher"), "py_func", None)
                name = f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}" if fn is not None else "?"
                progress.on_start(name)

            def on_end(self, ev):
                progress.on_end()

        event.register("numba:compile", Listener())
        _installed = True
