"""Offline batch jobs in OpenAI's batch file format: `edgeinfer batch` and `edgeinfer.batch.run_batch`.

Each input line is one request, {"custom_id", "method": "POST", "url", "body"}, for /v1/chat/completions,
/v1/completions or /v1/embeddings. Each output line is its answer, {"id", "custom_id", "response":
{"status_code", "request_id", "body"}, "error"}, with the same body `edgeinfer serve` would send (read,
refused and answered by the code the server uses, edgeinfer.openai; the line format is
edgeinfer.openai.batchfile).

- Every request goes through the continuous-batching engine together with the others (the caller's
  thread steps the engine and, between steps, reads requests and writes answers), so a batch gets the
  engine's many-stream throughput.
- The output is appended one whole line per answer, flushed as it is written: a crash loses only the
  requests in flight. A rerun skips the custom_ids already answered (failed ones too, unless
  retry_errors) and drops a torn last line, so a job resumes where it stopped.
- A line that is not a valid request gets an error line of its own and the job goes on.

Ray (edgeinfer.batch_ray) runs the same job on a cluster, with this module's reading and writing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable

from .errors import EdgeInferError
from .openai import protocol as P
from .openai import responses as R
from .openai.batchfile import Item, error_record, parse_line, record


class BatchError(EdgeInferError):
    """A job that cannot run at all: no input, an output that is not a batch's, duplicate custom_ids."""


def read_input(path: str | os.PathLike) -> list[Item]:
    """Every request line of a batch file (blank lines are skipped). Two lines with one custom_id
    make the whole job an error, as OpenAI's batch API does: answers could not be told apart."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise BatchError(f"cannot read the batch input {os.fspath(path)!r}: {e.strerror}") from None
    items, seen = [], {}
    with f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            it = parse_line(n, raw.rstrip(b"\r\n"))
            if it.custom_id is not None:
                if it.custom_id in seen:
                    raise BatchError(f"custom_id {it.custom_id!r} is on line {seen[it.custom_id]} and line {n} "
                                     f"of {os.fspath(path)}: each request needs its own")
                seen[it.custom_id] = n
            items.append(it)
    return items


_LINE_START = b'{"id": "batch_req_'  # how every output line begins (record())


def _key_of(rec: dict) -> str | tuple | None:
    """An output line's Item.key."""
    cid = rec.get("custom_id")
    if isinstance(cid, str):
        return cid
    line = rec["error"].get("line") if isinstance(rec.get("error"), dict) else None
    return ("line", line) if isinstance(line, int) else None


class BatchOutput:
    """The output file, appended one flushed line per answer, locked against a second job writing it.

    Opening it reads what an earlier run wrote: the keys it answered (self.done), failures among them
    (dropped first when retry_errors), and a torn last line, which is cut off."""

    def __init__(self, path: str | os.PathLike, retry_errors: bool = False):
        self.path = os.fspath(path)
        self.done: set = set()  # Item.key of every line answered
        self.torn = 0  # bytes of a half-written last line, dropped
        self.retried = 0  # error lines dropped for retry_errors
        self._fd = self._open()
        try:
            self._resume(retry_errors)
        except BaseException:
            os.close(self._fd)
            raise

    def _open(self) -> int:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise BatchError(f"cannot write the batch output {self.path!r}: {e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise BatchError(f"another batch job is writing {self.path!r}; wait for it, or give another output "
                             "file") from None
        return fd

    def _resume(self, retry_errors: bool) -> None:
        size = os.fstat(self._fd).st_size
        data = os.pread(self._fd, size, 0) if size else b""
        end = data.rfind(b"\n") + 1
        tail, data = data[end:], data[:end]
        kept, dropped = [], 0
        for n, line in enumerate(data.splitlines(keepends=True), 1):
            try:
                rec = json.loads(line)
            except ValueError:
                rec = None
            key = _key_of(rec) if isinstance(rec, dict) and "response" in rec else None
            if key is None:
                raise BatchError(f"{self.path!r} line {n} is not a batch output line: give a new output file, or "
                                 "the output of an earlier run of this job to resume it")
            if retry_errors and rec.get("error") is not None:
                dropped += 1
                continue
            kept.append(line)
            self.done.add(key)
        if tail:  # the start of a line the last run was killed while writing: dropped (anything else is
            if not (tail.startswith(_LINE_START) or _LINE_START.startswith(tail)):  # not ours to cut)
                raise BatchError(f"{self.path!r} ends in a line that is not a batch output line: give a new "
                                 "output file, or the output of an earlier run of this job to resume it")
            self.torn = len(tail)
            os.ftruncate(self._fd, end)
        if dropped:  # rewritten whole, then renamed over: a crash here leaves the old file or the new
            tmp = f"{self.path}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                f.writelines(kept)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            os.close(self._fd)
            self._fd = self._open()
            self.retried = dropped
        os.lseek(self._fd, 0, os.SEEK_END)

    def write(self, rec: dict) -> None:
        """Append one answer as one whole line, in one write, flushed to the OS before the next."""
        data = (json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8")
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]

    def close(self) -> None:
        if self._fd >= 0:
            try:
                os.fsync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = -1


@dataclass
class BatchSummary:
    """What a run did: requests in the input, answered by earlier runs (skipped), and by this one."""

    input: str
    output: str
    requests: int
    skipped: int
    succeeded: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    retried_errors: int = 0
    torn_line_dropped: bool = False
    workers: int = 1
    statuses: dict = field(default_factory=dict)  # status code -> lines

    @property
    def tokens_per_second(self) -> float:
        return self.completion_tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "tokens_per_second": round(self.tokens_per_second, 2)}

    def count(self, rec: dict) -> None:
        status = rec["response"]["status_code"]
        self.statuses[str(status)] = self.statuses.get(str(status), 0) + 1
        if rec.get("error") is None:
            self.succeeded += 1
            u = (rec["response"]["body"] or {}).get("usage") or {}
            self.prompt_tokens += u.get("prompt_tokens", 0)
            self.completion_tokens += u.get("completion_tokens", 0)
        else:
            self.failed += 1

    def line(self) -> str:
        s = (f"{self.succeeded + self.failed} requests answered in {self.seconds:.1f} s: {self.succeeded} succeeded, "
             f"{self.failed} failed")
        if self.skipped:
            s += f"; {self.skipped} already in the output, skipped"
        if self.completion_tokens:
            s += f"; {self.completion_tokens} tokens generated, {self.tokens_per_second:.1f} tok/s"
        return s + f" -> {self.output}"


class Pending:
    """A generation in the engine: each of its choices' output gathered as steps produce it."""

    __slots__ = ("item", "gen", "outputs", "left")

    def __init__(self, item: Item, gen):
        from .openai.handlers import Output

        self.item, self.gen = item, gen
        self.outputs = [Output() for _ in range(gen.n)]
        self.left = gen.n

    def add(self, index: int, out) -> bool:
        """One step's output of choice `index`; True once every choice is finished."""
        self.left -= self.outputs[index].add(out)
        return not self.left


class Processor:
    """Turns request lines into answers for one loaded model: the server's reading and refusing, the
    engine for generations, the model's embed path for embeddings.

    By default the caller's thread steps the engine (run()), as LLM.generate does. threaded (a Ray
    actor, whose calls come on an event loop; the model loaded with engine.loop.exclusive): the
    compute thread steps it through an EngineLoop, and embeddings are computed there too. Either way
    one thread computes (edgeinfer.engine.loop says why)."""

    def __init__(self, llm, threaded: bool = False):
        from .engine.loop import EngineLoop

        self.llm = llm
        self.name = llm.name
        self.threaded = threaded
        self.loop = EngineLoop(llm.engine, "batch").start() if threaded and llm.engine is not None else None
        # without a loop: this caller's requests in the engine (stepped by run()), and each one's callback
        self._run = llm.engine.run() if self.loop is None and llm.engine is not None else None
        self._callbacks: dict[str, Callable] = {}

    def start(self, item: Item, on_done: Callable[[Pending], None]) -> dict | None:
        """Begin a request: its answer now (an error, or an embedding, computed at once), or None when it
        went to the engine, and on_done(pending) comes once it is finished (from the thread that steps)."""
        from .openai import handlers as H  # it imports the grammar compiler (and Numba)

        if item.error is not None:
            return error_record(item, item.error)
        body = item.body
        try:
            if item.kind == "embeddings":
                return self._embed(item)
            if body.get("stream"):
                raise P.bad("stream", "a batch does not stream: leave 'stream' out (each answer is one output line)")
            req = P.parse_common(body, chat=item.kind == "chat")
            chosen = self._check_model(req.model)
            gen = H.prepare_generation(self.llm, self.name, body, req, item.kind == "chat")
            if chosen is not None and gen.params.lora is None:  # a line naming an adapter (batch --lora NAME=FILE)
                gen.params = dataclasses.replace(gen.params, lora=chosen)
            pending = Pending(item, gen)

            def on_output(out):
                if pending.add(out.index, out):
                    on_done(pending)

            # n choices (body "n"): one engine request; the engine shares the prompt's blocks among them
            try:
                if self.loop is not None:
                    self.loop.submit(gen.prompt_ids, gen.params, on_output, req.priority, gen.guide, gen.n)
                else:
                    rid = self._run.submit(gen.prompt_ids, gen.params, priority=req.priority, guide=gen.guide,
                                           n=gen.n)
                    self._callbacks[rid] = on_output
            except ValueError as e:  # does not fit the KV cache, however empty
                raise P.bad("max_tokens", str(e)) from None
        except P.APIError as e:
            return error_record(item, e)
        return None

    def finish(self, p: Pending) -> dict:
        """A finished generation's output line."""
        if any(o.reason == "error" for o in p.outputs):
            return error_record(p.item, P.APIError(500, f"generation failed: {getattr(self.loop, 'last_error', None)}"))
        body = R.completion_response(p.gen, self.name, self.llm.tokenizer, p.outputs)
        return record(p.item, 200, body)

    def _check_model(self, model: str | None):
        """None, or the adapter a line's model names ((name, 1.0),); a 404 for another model."""
        adapters = getattr(self.llm.model, "lora", None)
        if model is not None and adapters is not None and model in adapters.names:
            return ((model, 1.0),)
        if model is not None and model != self.name:
            raise P.APIError(404, f"model {model!r} is not this batch's model; this batch runs {self.name!r} (give "
                                  "that name, or leave 'model' out)", param="model", code="model_not_found")

    def _embed(self, item: Item) -> dict:
        from .engine.loop import exclusive
        from .openai import handlers as H

        inputs, fmt, dims, truncate = P.parse_embeddings(item.body)
        if self._check_model(P.parse_model(item.body)) is not None:
            raise P.bad("model", "embeddings through a LoRA adapter are not there yet: name the base model")
        seqs = H.embedding_inputs(self.llm, self.name, inputs, dims, truncate)
        if self.threaded:  # on the compute thread, between steps
            vecs = exclusive(self.llm.embed_ids, seqs, dimensions=dims)
        else:
            vecs = self.llm.embed_ids(seqs, dimensions=dims)
        return record(item, 200, R.embeddings_response(self.name, vecs, sum(len(s) for s in seqs), fmt))

    def run(self, items: Iterable[Item], emit: Callable[[dict], None], window: int) -> None:
        """Answer every item in this thread, stepping the engine here, calling emit(record) as each is
        done, with at most `window` generations in the engine at a time."""
        done: list[Pending] = []
        in_flight = 0
        items = iter(items)
        more = True
        try:
            # left early (an interrupt): what is left is aborted and its blocks freed; an encoder has no engine
            with self._run or contextlib.nullcontext():
                while True:
                    while more and in_flight < window:  # top the engine up: it always has the next ready
                        item = next(items, None)
                        if item is None:
                            more = False
                            break
                        rec = self.start(item, done.append)
                        if rec is None:
                            in_flight += 1
                        else:
                            emit(rec)
                    if not in_flight:
                        break
                    for out in self._run.step():
                        cb = self._callbacks.pop(out.request_id) if out.done else self._callbacks[out.request_id]
                        cb(out)
                    for p in done:
                        emit(self.finish(p))
                    in_flight -= len(done)
                    done.clear()
        finally:
            self._callbacks.clear()


class Job:
    """A batch job's input, output and summary, whoever answers the requests (this process or Ray).
    Made before the model loads, so a bad input or a locked output fails at once."""

    def __init__(self, input_path, output_path, retry_errors: bool = False, progress: bool = True):
        self.items = read_input(input_path)
        self.output = BatchOutput(output_path, retry_errors)
        self.todo = [it for it in self.items if it.key not in self.output.done]
        self.summary = BatchSummary(os.fspath(input_path), self.output.path, len(self.items),
                                    len(self.items) - len(self.todo), retried_errors=self.output.retried,
                                    torn_line_dropped=bool(self.output.torn))
        self.progress = progress
        self.bar = None
        self.t0 = time.perf_counter()

    def start(self) -> None:
        """The clock and the progress bar start: the model is loaded."""
        from tqdm import tqdm

        self.bar = tqdm(total=len(self.todo), desc="batch", unit="req", disable=not self.progress, file=sys.stderr,
                        dynamic_ncols=True, smoothing=0.1)
        self.t0 = time.perf_counter()

    def emit(self, rec: dict) -> None:
        """Write one answer, count it, move the bar."""
        self.output.write(rec)
        self.summary.count(rec)
        self.bar.update(1)
        elapsed = time.perf_counter() - self.t0
        if elapsed > 0 and self.summary.completion_tokens:
            self.bar.set_postfix_str(f"{self.summary.completion_tokens / elapsed:.1f} tok/s, "
                                     f"{self.summary.failed} failed", refresh=False)

    def close(self) -> BatchSummary:
        self.summary.seconds = round(time.perf_counter() - self.t0, 3)
        if self.bar is not None:
            self.bar.close()
        self.output.close()
        return self.summary


def run_job(llm, job: Job, window: int = 0) -> BatchSummary:
    """Answer a job's requests with a loaded model. window: generations in the engine at once (0: four
    times the engine's running sequences, so the scheduler always has the next ones ready)."""
    try:
        job.start()
        limit = window or 4 * (llm.engine.max_seqs if llm.engine is not None else 1)
        Processor(llm).run(job.todo, job.emit, limit)
    finally:
        summary = job.close()
    return summary


def run_batch(llm, input_path, output_path, *, retry_errors: bool = False, progress: bool = True,
              window: int = 0) -> BatchSummary:
    """Answer a batch file in OpenAI's batch format (one {"custom_id", "method", "url", "body"} per line, for
    /v1/chat/completions, /v1/completions or /v1/embeddings) with a loaded model into output_path, one
    {"id", "custom_id", "response", "error"} line per request, all generations going through the engine
    together. Resumable: custom_ids already in the output are skipped (failed ones too, unless
    retry_errors)."""
    return run_job(llm, Job(input_path, output_path, retry_errors, progress), window)
