"""`edgeinfer batch --ray`: a batch job on a Ray cluster, one model replica per Ray actor.

The driver (this process) reads the input, skips what the output already answers, and writes every
answer into the one output file, exactly as a local run (edgeinfer.batch.Job): resumable, one flushed
line per answer. In between, Ray Data splits the requests into blocks and hands them, batch by batch,
to a pool of actors (BatchWorker), each of which loads the model once, runs its own continuous-batching
engine with as many threads as the CPUs Ray gave it, and answers through edgeinfer.batch.Processor.

An actor keeps several batches in flight (its calls are async), so its engine never runs dry between
batches. A batch's answers come back together when the whole batch is done: if an actor dies, Ray
restarts it and runs the batch again, and no half of a batch was ever seen by the driver. The driver
still writes each custom_id at most once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys

from .batch import BatchError, BatchSummary, Job, Processor
from .openai.batchfile import Item, error_record

ROWS_PER_BATCH = 8  # requests per actor call (also Ray Data's block size): what a killed actor redoes


def _import_ray():
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as e:
        raise BatchError(f"--ray needs the 'ray' extra ({e.name} is not installed): pip install 'edgeinfer[ray]'") \
            from None
    return ray


class BatchWorker:
    """One model replica (a Ray actor): answers the batches of requests Ray Data gives it."""

    def __init__(self, model: str, threads: int, engine_kwargs: dict, max_seqs: int = 0):
        import ray

        from .config import EngineConfig
        from .engine.loop import exclusive
        from .llm import LLM

        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", threads)
        # threads: the CPUs Ray gave this actor (a fraction of one still computes on one thread)
        self.threads = max(1, round(cpus))
        config = EngineConfig(threads=self.threads, max_seqs=max_seqs, **engine_kwargs)
        # loaded on the compute thread, which steps it: calls come on the actor's event loop
        self.llm = exclusive(LLM, model, engine_config=config, progress=False)
        self.proc = Processor(self.llm, threaded=True)

    async def __call__(self, batch: dict):
        import asyncio

        aloop = asyncio.get_running_loop()
        answers: list = []
        waiting = []
        for line, cid, kind, body in zip(batch["line"], batch["custom_id"], batch["kind"], batch["body"]):
            item = Item(int(line), str(cid), str(kind), json.loads(body))
            fut = aloop.create_future()
            answer = self.proc.start(item, lambda p, fut=fut: aloop.call_soon_threadsafe(fut.set_result, p))
            if answer is None:
                waiting.append((len(answers), fut))
            answers.append(answer)
        for i, fut in waiting:
            answers[i] = self.proc.finish(await fut)
        yield {"record": [json.dumps(a, ensure_ascii=False) for a in answers]}


def cpus_per_worker(total: float, workers: int, threads: int, reserve: float = 0.5) -> float:
    """The CPUs each actor asks Ray for: `threads`, or a fraction when the workers would take every CPU
    of the cluster, leaving `reserve` for Ray Data's own tasks."""
    if workers * threads <= total - reserve:
        return float(threads)
    return max(0.01, math.floor((total - reserve) / workers * 100) / 100)


def model_source(model: str, address: str, progress: bool) -> str:
    """What each actor loads: a file's absolute path (a shared path, the same on every node), or the name,
    which each node resolves in its own cache (a catalog model is pulled there on first use). A local
    cluster's model is pulled here first, once; an unknown name fails here, not in every actor."""
    from pathlib import Path

    from . import registry

    p = Path(model).expanduser()
    if p.is_file():
        return str(p.resolve())
    if address == "local":
        registry.resolve(model, progress=progress)
    elif registry.lookup(model) is None:
        registry.resolve(model, pull_missing=False)
    return model


def connect(address: str):
    """Join a Ray cluster: "local" starts one on this machine, "auto" the one it belongs to."""
    ray = _import_ray()
    # the job's own bar and summary are the output: Ray's logs stay in its session folder
    # (/tmp/ray/session_latest/logs), and an actor's error still comes back as the driver's exception
    kw = dict(include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    try:
        if address == "local":
            ray.init(num_cpus=os.cpu_count(), **kw)
        else:
            ray.init(address=address, **kw)
    except (ConnectionError, ValueError, RuntimeError) as e:
        raise BatchError(f"cannot reach the Ray cluster at {address!r}: {e} (start one with `ray start --head`, "
                         "or give --ray local)") from None
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # the job's own bar counts answers
    ctx.print_on_execution_start = False
    return ray


@contextlib.contextmanager
def _stdout_to_stderr():
    """Whatever Ray prints (a worker's retry, its warnings) goes to stderr: stdout is the job's (--json)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def run_batch_ray(model: str, input_path, output_path, *, address: str = "local", workers: int | None = None,
                  threads: int = 1, retry_errors: bool = False, progress: bool = True,
                  engine_kwargs: dict | None = None, max_seqs: int = 0) -> BatchSummary:
    """The batch job of edgeinfer.batch.run_batch, answered by `workers` actors on a Ray cluster
    (default: as many as the cluster's CPUs hold at `threads` each)."""
    job = Job(input_path, output_path, retry_errors, progress)  # a bad input fails before Ray starts
    ray = None
    try:
        requests = [it for it in job.todo if it.error is None]
        source = model_source(model, address, progress) if requests else model
        with _stdout_to_stderr():
            if requests:
                ray = connect(address)
            try:
                _run(ray, job, requests, source, address, workers, threads, engine_kwargs or {}, max_seqs)
            except BatchError:
                raise
            except Exception as e:
                if ray is None or not isinstance(e, ray.exceptions.RayError):
                    raise
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise BatchError(f"the Ray job failed: {first[:500]}; the answers so far are in "
                                 f"{job.output.path}, and running the same command again resumes") from None
            finally:
                if ray is not None and address == "local":
                    ray.shutdown()
    finally:
        summary = job.close()
    return summary


def _run(ray, job: Job, requests: list[Item], source: str, address: str, workers: int | None, threads: int,
         engine_kwargs: dict, max_seqs: int) -> None:
    job.start()
    for it in job.todo:  # lines that are not requests: answered here, never shipped
        if it.error is not None:
            job.emit(error_record(it, it.error))
    if not requests:
        return
    total = ray.cluster_resources().get("CPU", 0.0)
    if total <= 0:
        raise BatchError(f"the Ray cluster at {address!r} has no CPUs")
    workers = workers or max(1, int(total // threads))
    per = cpus_per_worker(total, workers, threads)
    job.summary.workers = workers
    rows = [{"line": it.line, "custom_id": it.custom_id, "kind": it.kind, "body": json.dumps(it.body)}
            for it in requests]
    ds = ray.data.from_items(rows, override_num_blocks=max(1, math.ceil(len(rows) / ROWS_PER_BATCH)))
    # calls in flight per actor: twice the sequences its engine runs at once, so it never runs dry
    seqs = max_seqs or max(8, 4 * max(1, round(per)))
    in_flight = max(2, math.ceil(2 * seqs / ROWS_PER_BATCH))
    answers = ds.map_batches(
        BatchWorker, batch_size=ROWS_PER_BATCH, batch_format="numpy",
        fn_constructor_kwargs=dict(model=source, threads=threads, engine_kwargs=engine_kwargs, max_seqs=max_seqs),
        compute=ray.data.ActorPoolStrategy(size=workers, max_tasks_in_flight_per_actor=in_flight,
                                           max_concurrent_calls_per_actor=in_flight),
        num_cpus=per)
    wanted = {it.custom_id for it in requests}
    for b in answers.iter_batches(batch_size=None, batch_format="numpy"):
        for text in b["record"]:
            rec = json.loads(text)
            if rec["custom_id"] in wanted:  # a batch Ray ran twice is written once
                wanted.discard(rec["custom_id"])
                job.emit(rec)
    if wanted:
        raise BatchError(f"the Ray job ended without answers for {len(wanted)} requests (such as "
                         f"{sorted(wanted)[0]!r}); run the same command again to answer them")
