"""One caller's requests through the shared engine: submit, step, collect, and clean up on the way out.

Every in-process caller (LLM.generate and stream, the batch job, the bench) does the same thing: add
requests, step the engine until they finish, pick their outputs out of each step's, and abort whatever is
left if it stops early. A Run is that loop, written once:

    with engine.run() as run:
        rids = [run.submit(ids, params) for ids in prompts]
        for out in run:                 # or run.steps(): one list per engine step
            ...

Leaving the `with` block (a break, an exception, Ctrl-C) aborts the run's unfinished requests and steps
the engine once so their KV blocks are freed. Other requests in the engine run on; their outputs are not
this run's and are dropped here (the server's EngineLoop, which serves many callers, routes them instead).
"""

from __future__ import annotations

from typing import Iterator


class Run:
    def __init__(self, engine):
        self.engine = engine
        self.pending: set[str] = set()  # submitted and not finished

    def submit(self, prompt_ids, params, **kw) -> str:
        """engine.add_request (n choices too), the request tracked by this run."""
        rid = self.engine.add_request(prompt_ids, params, **kw)
        self.pending.add(rid)
        return rid

    def step(self) -> list:
        """One engine step: the outputs of this run's requests."""
        outs = [o for o in self.engine.step() if o.request_id in self.pending]
        for o in outs:
            if o.done:  # every choice of it
                self.pending.discard(o.request_id)
        return outs

    def steps(self) -> Iterator[list]:
        """Step until every submitted request has finished, one list of outputs per step."""
        while self.pending:
            yield self.step()

    def __iter__(self) -> Iterator:
        for outs in self.steps():
            yield from outs

    def close(self) -> None:
        """Abort what is unfinished and free its blocks (one step, which also drains the aborts)."""
        if self.pending:
            for rid in self.pending:
                self.engine.abort(rid)
            self.pending.clear()
            self.engine.step()

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
