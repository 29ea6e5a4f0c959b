"""Compile what a model needs, ahead of use, in worker processes (one per core).

A model needs the compiled step for its KV type, paged attention for that KV type, one matmul unit per
kernel family of its weight kinds (units.py), and a few top-level kernels (the embedding lookup, the
output projection's activation quantization, the final norm). Each is a job: a dispatcher and the
exact argument types it will be called with, as Numba types, so that no weights are needed to compile
them (the step's are typed from a stand-in of what it is called with: step_sig). Jobs already in the
cache (cache.py) are skipped; the rest run longest first in a pool of processes, which write the cache
that this process then loads from. Numba's global compiler
lock makes threads useless for this; processes share nothing but the cache folder, and each job writes
its own index files, so they never race (units.rows_unit).

`start` returns at once: the compile runs while the model loads (and, in `chat`, while the user types),
with one status line naming what is compiling and how much is left; `wait` blocks until it is done.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

import numba
import numpy as np
from numba import types

from ..kinds import KINDS, is_quantized, uses_q8k
from ..kv_format import kv_pair
from . import background, units

_A = types.Array
_F32_1, _F32_2 = _A(types.float32, 1, "C"), _A(types.float32, 2, "C")
_I64_1 = _A(types.int64, 1, "C")
EMBEDDING_SIG = (*units.MAT.types, units.LUTS, _I64_1, _F32_2)  # units.embedding_unit's (backend.embed)


@dataclass(frozen=True)
class Job:
    name: str    # what the status line shows
    ref: tuple   # ("attr", module, name), ("rows", path, family), ("embedding", kind): how a worker finds it
    sig: tuple   # the argument types
    cost: float  # seconds on a 2-core Zen 3 (measured), to start the longest first
    later: bool = False  # what only the compiled step needs: compiled after the first answer (background.py)


def step_sig(kv: str) -> tuple:
    """step.forward_layers' argument types for a KV cache of type kv: those of a stand-in LayerStack's
    arguments (step.stand_in_args, what LayerStack.run passes), a Python list standing for the typed list
    of its items that a real stack holds."""
    from . import step

    return tuple(types.ListType(numba.typeof(a[0])) if isinstance(a, list) else numba.typeof(a)
                 for a in step.stand_in_args(*units.KV_DTYPES[kv]))


def altup_sig(kv: str) -> tuple:
    """altup.forward_layers' argument types for a KV cache of type kv: the step's of the same names (step_sig)
    and a stand-in AltupPart's (Gemma 3n's walk)."""
    from .altup import AltupPart

    s = step_sig(kv)
    f1, f2, f3 = (np.zeros((1,) * n, np.float32) for n in (1, 2, 3))
    u3 = np.zeros((1, 1, 1), np.uint16)
    part = AltupPart(0, f2, f3, f3, f3, f2, 0, u3, u3, f2, f1, np.float32(1.0))
    return (types.Array(types.float32, 3, "C"), *s[1:15], s[16], s[17], s[18], s[20], s[21], s[22], s[31], s[32],
            numba.typeof(part), s[33], s[34])


def resolve(ref: tuple):
    """The dispatcher a job names."""
    if ref[0] == "rows":
        return units.rows_unit(ref[1], ref[2])
    if ref[0] == "embedding":
        return units.embedding_unit(ref[1])
    import importlib

    return getattr(importlib.import_module(ref[1]), ref[2])


_PKG = __name__.rsplit(".", 1)[0]


def plan(path: str, kinds, kv_types, small_path: str | None = None, experts: bool = False,
         mixers: tuple = (), first_answer: bool = False) -> list[Job]:
    """Every job a model of these matrix kinds (quantized, as the backend holds them) needs on `path` (and
    small_path, that of the matmuls of a few tokens: units.Table); experts: the model has a mixture of
    experts (its FFN is a unit of its own, step.call_experts); mixers: its recurrent mixers that the step
    runs (units of their own, step.call_mixer: step.MIXERS' names, models/common.step_mixers), and "altup"
    for a model whose layers run in altup.py's walk instead of the step.

    first_answer: plan for a first answer on the per-op forward (models/decoder.py: the step's bits, one
    call per op) while the step compiles: the per-op forward's own kernels join the jobs, and what only the
    step needs (the step, its experts and mixer units, the few-token units: the path's own serve every token
    count meanwhile) is marked `later`."""
    kinds = {int(k) for k in kinds if is_quantized(k)}
    fa = first_answer
    if "altup" in mixers:  # Gemma 3n: its own walk over its streams (altup.py) in place of the step
        mixers = tuple(m for m in mixers if m != "altup")
        jobs = [Job(f"altup walk ({kv} KV)", ("attr", f"{_PKG}.altup", "forward_layers"), altup_sig(kv), 19.0, fa)
                for kv in kv_types]
    else:
        jobs = [Job(f"step ({kv} KV)", ("attr", f"{_PKG}.step", "forward_layers"), step_sig(kv), 19.0, fa)
                for kv in kv_types]
    # the typed lists of the step's (and the walk's) matrices (step.LayerStack.lists)
    jobs += [Job("step's lists", ("attr", f"{_PKG}.step", "_new_list"), (units.MAT,), 0.5, fa),
             Job("step's lists (append)", ("attr", f"{_PKG}.step", "_append"), (types.ListType(units.MAT), units.MAT),
                 0.5, fa)]
    if experts:
        from .step import experts_sig

        jobs.append(Job("experts", ("attr", f"{_PKG}.parts.moe", "forward"), experts_sig(), 8.0, fa))
    if mixers:
        from .step import mixer_sig

        jobs += [Job(f"mixer {m}", ("attr", f"{_PKG}.parts.{m}", "forward"), mixer_sig(m), 4.0, fa) for m in mixers]
    if fa:
        jobs += per_op_jobs(kv_types)
    jobs += [Job(f"attention ({kv} KV)", ("attr", f"{_PKG}.attention", "paged_attention"), units.attention_sig(kv),
                 9.5) for kv in kv_types]
    fams = sorted({units.FAMILY_OF[k] for k in kinds})
    jobs += [Job(f"matmul {fam}", ("rows", path, fam), units.ROWS_SIG, 4.0) for fam in fams]
    if small_path not in (None, path):
        jobs += [Job(f"matmul {fam} ({small_path}, few tokens)", ("rows", small_path, fam), units.ROWS_SIG, 4.0, fa)
                 for fam in fams]
    jobs += [Job(f"embedding {KINDS[k].name}", ("embedding", k), EMBEDDING_SIG, 1.0) for k in sorted(kinds)]
    jobs.append(Job("output norm", ("attr", f"{_PKG}.ops", "rmsnorm"), (_F32_2, _F32_1, types.float32, _F32_2), 1.0))
    if any(not uses_q8k(k) for k in kinds):
        jobs.append(Job("quantize q8", ("attr", f"{_PKG}.int8", "quantize_q8"), (_F32_2, *units.Q8.types), 1.0))
    if any(uses_q8k(k) for k in kinds):
        jobs.append(Job("quantize q8_K", ("attr", f"{_PKG}.int8", "quantize_q8k"),
                        (_F32_2, *units.Q8K.types), 1.5))
    return jobs


def per_op_jobs(kv_types) -> list[Job]:
    """The kernels the per-op forward of a transformer calls besides those every model needs (the matmuls'
    dispatcher, the norms with the eps a layer passes, RoPE, the gated activation, the KV writes), with the
    argument types the models pass them (what a first answer on the per-op forward compiles)."""
    f2, f3 = _F32_2, _A(types.float32, 3, "C")
    ops, i8 = f"{_PKG}.ops", f"{_PKG}.int8"
    jobs = [Job("matmuls", ("attr", i8, "matmuls"), (*(units.MAT,) * 3, types.int64, units.Q8, units.Q8K, units.LUTS,
                                                     f2, f2, f2, types.int64, _I64_1), 2.0),
            Job("rmsnorm", ("attr", ops, "rmsnorm"), (f2, _F32_1, types.float64, f2), 1.0),
            Job("rope", ("attr", ops, "rope"), (f3, _I64_1, _A(types.float64, 1, "C"), types.boolean, types.float64),
                1.0),
            Job("gated activation", ("attr", ops, "gated_act"), (f2, f2, f2, types.boolean), 1.5)]
    for kv in kv_types:
        caches = [_A(numba.from_dtype(np.dtype(d)), 3, "C") for d in units.KV_DTYPES[kv]]
        rows = [_A(types.uint16 if t == "f16" else types.float32, 3, "C") for t in kv_pair(kv)]
        jobs.append(Job(f"KV writes ({kv} KV)", ("attr", ops, "write_kv"), (*rows, _I64_1, *caches), 1.0))
    return jobs


def is_cached(job: Job) -> bool:
    """Whether the cache holds this job's code for this process's tier (looked up, not loaded)."""
    d = resolve(job.ref)
    if tuple(job.sig) in d.overloads:
        return True
    c = d._cache
    try:
        return c._index_key(tuple(job.sig), d.targetctx.codegen()) in c._cache_file._load_index()
    except Exception:  # an unreadable index: the compile will rewrite it
        return False


def _orphan_watch(parent: int) -> None:
    # in a worker process: end it once the process that started it is gone (killed: nothing else would)
    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="edgeinfer-compile-parent", daemon=True).start()


def _compile_job(job: Job) -> float:
    # in a worker process: compile one job into the cache
    t0 = time.perf_counter()
    resolve(job.ref).compile(tuple(job.sig))
    return time.perf_counter() - t0


class Compile:
    """A parallel compile in flight (`start`)."""

    def __init__(self, jobs: list[Job], workers: int, stream, note: str = ""):
        self.note = note  # said after the count when it ends
        self.jobs = sorted(jobs, key=lambda j: -j.cost)
        self.workers = max(1, min(workers, len(self.jobs)))
        self.stream = stream
        self.seconds = {}  # job name -> seconds it took in its worker
        self.error = None
        self.t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="edgeinfer-compile", daemon=True)
        self._thread.start()

    def _line(self, running: list[str], done: int, end: str = "") -> None:
        if self.stream is None:
            return
        now = time.perf_counter() - self.t0
        if end:
            msg = f"\rcompiled {done} kernel units in {now:.1f} s ({self.workers} processes){self.note}{end}"
        else:
            msg = (f"\rcompiling kernels for this model (first run only; cached for later runs): "
                   f"{done}/{len(self.jobs)} done, {now:.0f} s [{', '.join(running)}]")
        self.stream.write(msg + "\x1b[K")
        self.stream.flush()

    def _run(self) -> None:
        import multiprocessing

        pending = list(self.jobs)
        try:
            with ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                     initializer=_orphan_watch, initargs=(os.getpid(),)) as pool:
                futs = {pool.submit(_compile_job, j): j for j in pending}
                running = [j.name for j in pending[: self.workers]]
                self._line(running, 0)
                done = 0
                for f in as_completed(futs):
                    j = futs[f]
                    self.seconds[j.name] = f.result()
                    done += 1
                    left = [x.name for x in pending if x.name not in self.seconds]
                    self._line(left[: self.workers], done)
            self._line([], done, end="\n")
            with _lock:
                finished.append({"wall_s": time.perf_counter() - self.t0, "workers": self.workers,
                                 "jobs_s": dict(self.seconds)})
        except Exception as e:  # a worker that died: this process compiles what is missing itself
            self.error = e
            if self.stream is not None:
                self.stream.write(f"\rparallel compile failed ({type(e).__name__}: {e}); compiling here\x1b[K\n")

    def wait(self) -> None:
        self._thread.join()

    def done(self) -> bool:
        return not self._thread.is_alive()


_active: list[Compile] = []
_lock = threading.Lock()
finished: list[dict] = []  # each compile this process ran to the end: its wall seconds, workers, seconds per job


def start(path: str, kinds, kv_types, *, workers: int = 0, stream=sys.stderr,
          small_path: str | None = None, experts: bool = False, mixers: tuple = (),
          later: bool = False) -> Compile | None:
    """Compile, in worker processes, what a model of these kinds and KV types needs and the cache lacks.
    None when nothing is missing. later: what only the compiled step needs may compile in the background
    (background.py; not with EDGEINFER_BACKGROUND_COMPILE=0), the first answers running per op meanwhile."""
    env = os.environ.get("EDGEINFER_COMPILE_WORKERS", "").strip()
    workers = workers or (int(env) if env.isdigit() else len(os.sched_getaffinity(0)))
    if workers == 0:  # EDGEINFER_COMPILE_WORKERS=0: compile in this process, at first use
        return None
    jobs = [j for j in plan(path, kinds, kv_types, small_path, experts, mixers) if not is_cached(j)]
    note = ""
    if jobs and later and background.enabled() and not experts and not mixers:
        # what only the compiled step needs goes to a background process; the first answer runs per op (a dense
        # model's: per_op_jobs covers its per-op forward; experts' and recurrent mixers' per-op kernels are others)
        both = [j for j in plan(path, kinds, kv_types, small_path, experts, mixers, True) if not is_cached(j)]
        later = [j for j in both if j.later]
        if later:
            background.start(__name__, {"path": path, "kinds": sorted(int(k) for k in kinds),
                                        "kv_types": list(kv_types), "small_path": small_path,
                                        "workers": workers}, later, is_cached)
            jobs = [j for j in both if not j.later]
            note = f"; {len(later)} more for full speed compile in the background"
    if not jobs:
        return None
    c = Compile(jobs, workers, stream, note)
    with _lock:
        _active.append(c)
    return c


def wait_all() -> None:
    """Block until every compile this process started is done (before a kernel it compiles is called)."""
    with _lock:
        pending = list(_active)
    for c in pending:
        c.wait()
    with _lock:
        for c in pending:
            if c in _active:
                _active.remove(c)


def active() -> bool:
    with _lock:
        return any(not c.done() for c in _active)


def _background(args: dict) -> None:
    # the background process (background.start): the `later` jobs of plan(**args) the cache still lacks, on
    # as many worker processes as the parallel compile that started it
    from . import cache

    workers = args.pop("workers")

    def missing():
        return [j for j in plan(**args, first_answer=True) if j.later and not is_cached(j)]

    background.compile_later(cache.folder(), missing, lambda jobs: Compile(jobs, workers, None).wait())


if __name__ == "__main__":  # python -m ...parallel_compile ARGS: background.start's process
    import json

    from edgeinfer.kernels.cpu import parallel_compile  # the module itself, not this __main__ copy

    parallel_compile._background(json.loads(sys.argv[1]))
