"""`edgeinfer serve`: an OpenAI-compatible HTTP server on the continuous-batching engine.

Every model's engine is stepped by the process's one compute thread (EngineLoop); the asyncio event
loop only parses, queues and streams, so it never blocks on compute. A request's outputs come back through
its own asyncio queue (server.streaming); a client that goes away has its request aborted and its KV
blocks freed. This module builds the app: the served models, the state the routes (server.routes) share,
middleware, start-up and shutdown.
"""

from __future__ import annotations

import sys
import threading
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import Route

from ..config import EngineConfig
from ..engine.loop import exclusive
from ..errors import EdgeInferError
from ..openai import responses as R
from ..openai import schemas as S
from ..registry import model_name
from . import routes
from .metrics import Metrics

DEFAULT_MAX_BODY = 4 * 1024 * 1024


@dataclass
class ServerConfig:
    models: list[str]
    threads: int = 0
    api_key: str | None = None
    cors_origins: list[str] = field(default_factory=list)
    max_queue: int = 64  # requests waiting for a slot, per model; past it: 503 + Retry-After
    request_timeout: float = 600.0
    read_timeout: float = 30.0  # the whole request body must arrive within this
    max_body_bytes: int = DEFAULT_MAX_BODY
    max_seqs: int = 0
    backend: str = "cpu"
    engine_config: EngineConfig | None = None
    model_configs: dict | None = None  # model source -> its own EngineConfig (a shared memory budget)
    # model source -> LLM keyword arguments for speculative decoding (draft, speculate, draft_tokens)
    speculation: dict | None = None


class ServedModel:
    """One model: loaded in the background, then served through its engine loop."""

    def __init__(self, name: str, source: str, engine_config: EngineConfig, speculation: dict | None = None):
        self.name = name
        self.source = source
        self.engine_config = engine_config
        self.speculation = speculation or {}
        self.llm = None
        self.loop = None
        self.error: str | None = None
        self.created = R.now()

    @property
    def ready(self) -> bool:
        return self.loop is not None or (self.llm is not None and self.llm.is_encoder and self.error is None)

    def load(self) -> None:
        from ..engine.loop import EngineLoop
        from ..llm import LLM

        try:
            # loaded on the compute thread, which will step it (edgeinfer.engine.loop says why)
            self.llm = exclusive(LLM, self.source, engine_config=self.engine_config, progress=False,
                                 **self.speculation)
            if self.llm.is_encoder:  # an embedding model: no engine; /v1/embeddings computes in a worker thread
                return
            self.llm.chat_template  # compiled now: a template that does not parse fails the load, not a request
            self.loop = EngineLoop(self.llm.engine, self.name).start()
        except Exception as e:  # reported by /health and every request to this model
            self.error = f"{type(e).__name__}: {e}"
            print(f"error: could not load model {self.name!r}: {e}", file=sys.stderr, flush=True)


class ServerState:
    """What every route reads (request.app.state.server): the config, the served models by name, the
    metrics, the API key as bytes and the OpenAPI document."""

    def __init__(self, config: ServerConfig):
        engine_config = config.engine_config or EngineConfig(threads=config.threads, max_seqs=config.max_seqs,
                                                             backend=config.backend)
        self.config = config
        self.served: dict[str, ServedModel] = {}
        for source in config.models:
            name = model_name(source)
            if name in self.served:
                raise EdgeInferError(f"model {name!r} is given twice")
            self.served[name] = ServedModel(name, source, (config.model_configs or {}).get(source, engine_config),
                                            (config.speculation or {}).get(source))
        self.metrics = Metrics(self.served)
        self.api_key = (config.api_key or "").encode("utf-8", "surrogateescape")
        self.openapi_doc = S.openapi(api_key=bool(config.api_key))

    def start(self) -> None:
        """Load every model in a background thread (/health says loading until then)."""
        def load_all():
            for sm in self.served.values():
                sm.load()
            if all(sm.ready for sm in self.served.values()):
                print(f"ready: serving {', '.join(self.served)}", file=sys.stderr, flush=True)

        threading.Thread(target=load_all, name="edgeinfer-load", daemon=True).start()

    def stop(self) -> None:
        for sm in self.served.values():
            if sm.loop is not None:
                sm.loop.stop(timeout=2.0)


@asynccontextmanager
async def _lifespan(app):
    app.state.server.start()
    yield
    app.state.server.stop()


ROUTES = [
    Route("/v1/chat/completions", routes.chat_completions, methods=["POST"]),
    Route("/v1/completions", routes.completions, methods=["POST"]),
    Route("/v1/embeddings", routes.embeddings, methods=["POST"]),
    Route("/v1/models", routes.list_models, methods=["GET"]),
    Route("/tokenize", routes.tokenize, methods=["POST"]),
    Route("/detokenize", routes.detokenize, methods=["POST"]),
    Route("/health", routes.health, methods=["GET"]),
    Route("/metrics", routes.metrics, methods=["GET"]),
    Route("/openapi.json", routes.openapi, methods=["GET"]),
]


def create_app(config: ServerConfig) -> Starlette:
    state = ServerState(config)
    middleware = []
    if config.cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=config.cors_origins, allow_methods=["GET", "POST"],
                                     allow_headers=["Authorization", "Content-Type"]))
    app = Starlette(
        routes=ROUTES,
        middleware=middleware,
        exception_handlers={404: routes.not_found, 405: routes.method_not_allowed, 500: routes.server_error},
        lifespan=_lifespan,
    )
    app.state.server = state
    app.state.served = state.served
    app.state.metrics = state.metrics
    return app


__all__ = ["ServerConfig", "ServerState", "create_app"]
