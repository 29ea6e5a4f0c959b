"""The compiled step's compile, after the first answer, in a process of its own that outlives this one.

With an empty kernel cache the compiled step (step.py, ~30 s on two cores) would keep a first answer
waiting, though the per-op forward (models/decoder.py) computes the same bits from kernels a third of its
size. So a first run compiles what the per-op forward needs in the parallel compile's workers, answers on
it, and leaves the rest (the jobs parallel_compile.plan marks `later`: the step, its experts and mixer
units, the few-token matmul units) to a detached process at the lowest priority, started here: it keeps
compiling into the cache after a short `generate` has exited, so the next run loads the step. A long-lived
process (a chat) switches to the step the moment the cache holds it (`done`).

One such process at a time per kernel folder (a lock file): a second waits, then compiles only what the
first left missing. `chat`, `generate` and LLM(compile_later=True) answer early this way, for dense models
(parallel_compile.start); everything else, `edgeinfer warmup` and EDGEINFER_BACKGROUND_COMPILE=0 compile
everything before the first forward pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

ENV = "EDGEINFER_BACKGROUND_COMPILE"
_POLL_S = 1.0  # how often `done` looks at the cache while the process runs


def enabled() -> bool:
    """Whether a first answer may run before the compiled step is ready (EDGEINFER_BACKGROUND_COMPILE)."""
    return os.environ.get(ENV, "1").strip() != "0"


class Later:
    """The jobs a process left to a background compile, and whether they are done."""

    def __init__(self, jobs: list, proc: subprocess.Popen, is_cached):
        self.jobs = jobs
        self.proc = proc
        self.is_cached = is_cached  # job -> whether the cache holds it (parallel_compile.is_cached)
        self._done = not jobs
        self._checked = 0.0
        self._lock = threading.Lock()

    def done(self) -> bool:
        """True once the cache holds every job (or the background process ended without them: whoever
        calls next compiles them at first use, as with no background at all). Looks at most once a second."""
        if self._done:
            return True
        with self._lock:
            now = time.monotonic()
            if self._done or now - self._checked < _POLL_S:
                return self._done
            self._checked = now
            self._done = self.proc.poll() is not None or all(map(self.is_cached, self.jobs))
            return self._done


_later: list[Later] = []


def start(module: str, args: dict, jobs: list, is_cached) -> Later:
    """Compile `jobs` in a detached process at the lowest priority, `python -m module ARGS` (`args` as JSON:
    parallel_compile's entry point, which plans them again from args and runs `compile_later`); a Later to
    ask whether they are done (is_cached: job -> whether the cache holds it)."""
    # a process group of its own (Ctrl-C in the terminal stops this process, not that one), in this session:
    # where the kernel groups processes by session for scheduling (autogroup), a new session's would compete
    # with this one as an equal, nice or not
    group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
    proc = subprocess.Popen([sys.executable, "-m", module, json.dumps(args)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True, **group)
    later = Later(jobs, proc, is_cached)
    _later.append(later)
    return later


def done() -> bool:
    """Whether every background compile this process started is done (the compiled step may run)."""
    return all(x.done() for x in _later)


def compile_later(folder: str, jobs_missing, run) -> None:
    """In the background process: take the lowest priority, then, one such process per kernel folder at a
    time (a lock file there), run(jobs) on the jobs still missing once the lock is held (jobs_missing())."""
    import fcntl

    try:  # the CPU only when nothing else wants it (its worker processes inherit this)
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        try:
            os.nice(19)
        except OSError:
            pass
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "background.lock"), "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        jobs = jobs_missing()
        if jobs:
            run(jobs)
