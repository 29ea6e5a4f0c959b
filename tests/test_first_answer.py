"""A first run answers before the compiled step is compiled (kernels/cpu/background.py): the parallel compile
plans what the per-op forward needs first and leaves the step and the few-token units to a background process;
until they are in the cache the models run per op with the same bits, and the units table serves every token
count from the path's own units."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from edgeinfer.kernels import kinds
from edgeinfer.kernels.cpu import backend, background, calls, parallel_compile, units

# a fresh process: 4 greedy tokens from a model; prints the tokens, the functions it compiled itself and
# whether the compiled step ran
DRIVER = r"""
import json, sys
from numba.core import event
seen = []
class L(event.Listener):
    def on_start(self, ev):
        seen.append(ev.data["dispatcher"])
    def on_end(self, ev):
        pass
event.register("numba:compile", L())
from edgeinfer import LLM, SamplingParams
from edgeinfer.kernels.cpu import step
llm = LLM(sys.argv[1], progress=True, compile_later=True)
out = llm.generate([1, 2, 3], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
misses = {d.py_func.__module__ + "." + d.py_func.__qualname__: sum(d._cache_misses.values()) for d in set(seen)}
print(json.dumps({"tokens": out.token_ids, "compiled": {k: v for k, v in misses.items() if v},
                  "step_ran": bool(step.forward_layers.overloads)}))
"""


def _drive(model, kernels_dir):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(kernels_dir), "EDGEINFER_BACKGROUND_COMPILE": "1"}
    p = subprocess.run([sys.executable, "-c", DRIVER, str(model)], capture_output=True, text=True, env=env,
                       timeout=600)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def test_the_plan_leaves_what_only_the_step_needs_for_later():
    q4k = next(iter(kinds.FAMILIES["kx8"]))
    jobs = parallel_compile.plan("avx512", {q4k}, ["f16"], small_path="avx2", first_answer=True)
    later = {j.name for j in jobs if j.later}
    assert later == {"step (f16 KV)", "step's lists", "step's lists (append)", "matmul kx8 (avx2, few tokens)"}
    first = {j.name for j in jobs if not j.later}
    assert {"attention (f16 KV)", "matmul kx8", f"embedding {kinds.KINDS[q4k].name}", "matmuls", "rope",
            "KV writes (f16 KV)"} <= first
    # without a first answer to hurry: no job is later, and the per-op forward's own kernels are not planned
    plain = parallel_compile.plan("avx512", {q4k}, ["f16"], small_path="avx2")
    assert not any(j.later for j in plain) and not {"matmuls", "rope"} & {j.name for j in plain}
    assert {j.name for j in plain} == {j.name for j in jobs} - {j.name for j in parallel_compile.per_op_jobs(["f16"])}


@pytest.mark.parametrize("kv", ["f16", "f32"])
def test_the_per_op_jobs_are_the_signatures_the_per_op_forward_calls(tiny_llama_path, kv):
    """What a first answer compiles ahead is what the per-op forward then calls: each planned signature is
    one its kernel was called with (a wrong one would leave the forward to compile its own, in this process,
    after the parallel compile)."""
    from edgeinfer import LLM

    llm = LLM(str(tiny_llama_path), progress=False, kv_type=kv)
    m = llm.model
    from edgeinfer.engine.kv_cache import KVCache
    from edgeinfer.engine.model_runner import Batch

    ids = np.array([1, 2, 3, 4, 5])
    pos = np.arange(5)
    c = KVCache.for_model(m.cfg, 4, 16, kv, kb=backend)
    m.forward_per_op(Batch(ids, pos, np.zeros(5), pos, np.arange(4)[None], pos), c)
    assert calls.kv_type_of(c.k.dtype, c.v.dtype) == kv
    for job in parallel_compile.per_op_jobs([kv]):
        d = parallel_compile.resolve(job.ref)
        assert tuple(job.sig) in {tuple(s) for s in d.signatures}, job.name


def test_the_few_token_slots_serve_from_the_paths_units_until_theirs_are_ready():
    from edgeinfer.kernels.cpu import simd

    path = backend.KERNEL_PATH
    other = next(p for p in ("avx2", "portable", "neon") if p != path and p in simd.available_paths())
    ready = [False]
    t = units.Table(path, other, small_ready=lambda: ready[0])
    fam = units.FAMILY_OF
    k = next(k for k in fam if fam[k] == "q8x8")
    addr = t.for_kinds((k,)).copy()
    assert addr[k] != 0 and addr[units.SMALL + k] == addr[k]  # the path's own unit, meanwhile
    ready[0] = True
    addr = t.for_kinds((k,))
    assert addr[units.SMALL + k] not in (0, addr[k])  # its own few-token unit once ready
    assert addr[units.SMALL + k] == units.address(units.rows_unit(other, "q8x8"), units.ROWS_SIG)


def test_a_model_runs_per_op_until_the_step_is_ready(tiny_llama_path, monkeypatch):
    from edgeinfer import LLM, SamplingParams

    llm = LLM(str(tiny_llama_path), progress=False)
    p = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    want = llm.generate([1, 2, 3], p)[0].token_ids
    monkeypatch.setattr(backend, "step_ready", lambda: False)
    stack = llm.model.stack
    monkeypatch.setattr(stack, "run", lambda *a, **k: pytest.fail("the step ran before it was ready"))
    assert llm.generate([1, 2, 3], p)[0].token_ids == want


def test_a_background_compile_that_ends_without_its_jobs_leaves_them_to_first_use(monkeypatch):
    """The step waits for the background compile while it runs and the cache lacks a job; a background process
    that ends without them (killed, out of memory) leaves them to be compiled at first use, as with no
    background at all, never waited on again; every job in the cache is done while it still runs."""
    monkeypatch.setattr(background, "_POLL_S", 0.0)
    cached = set()
    procs = [subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
             for _ in range(2)]
    try:
        later = background.Later(["a", "b"], procs[0], cached.__contains__)
        assert not later.done()
        cached.add("a")
        assert not later.done()
        procs[0].stdin.close()
        procs[0].wait(30)
        assert later.done() and "b" not in cached
        assert background.Later(["a"], procs[1], cached.__contains__).done() and procs[1].poll() is None
    finally:
        for p in procs:
            p.kill()
            p.wait(30)


# in a process of the fresh cache's: wait until the cache holds every job the first run left for later (each
# entry's data is written before the index names it: cache._locked_save), at most 600 s
WAIT = r"""
import sys, time
from edgeinfer.gguf_file import GGUFFile
from edgeinfer.kernels.cpu import backend, parallel_compile
from edgeinfer.models.common import matrix_kinds
kinds = matrix_kinds(GGUFFile(sys.argv[1]), backend)
jobs = [j for j in parallel_compile.plan(backend.KERNEL_PATH, kinds, ["f16"], backend.SMALL_PATH, first_answer=True)
        if j.later]
end = time.monotonic() + 600
while not all(map(parallel_compile.is_cached, jobs)):
    if time.monotonic() > end:
        sys.exit("the background compile did not finish: " + ", ".join(j.name for j in jobs))
    time.sleep(0.5)
"""


def _wait_for_background(model, kernels_dir):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(kernels_dir)}
    p = subprocess.run([sys.executable, "-c", WAIT, str(model)], capture_output=True, text=True, env=env,
                       timeout=660)
    assert p.returncode == 0, p.stderr


def test_a_first_run_answers_per_op_then_the_next_run_loads_the_step(tiny_llama_path, tmp_path):
    """An empty kernel cache: the first process answers without compiling the step (nor anything itself) and
    leaves its compile to a background process that outlives it; the next process compiles nothing, runs the
    step, and gets the same tokens."""
    first, err = _drive(tiny_llama_path, tmp_path / "kernels")
    # nothing compiled here but the weights' interleave that their loading runs (layout.py), where it does
    assert not [f for f in first["compiled"] if not f.startswith("edgeinfer.kernels.cpu.layout.")], first
    assert not first["step_ran"], first
    assert "compile in the background" in err
    _wait_for_background(tiny_llama_path, tmp_path / "kernels")
    again, _ = _drive(tiny_llama_path, tmp_path / "kernels")
    assert again["compiled"] == {} and again["step_ran"], again
    assert again["tokens"] == first["tokens"]
