"""`edgeinfer serve`: an OpenAI-compatible HTTP server on the continuous-batching engine.

Every model's engine is stepped by the process's one compute thread (EngineLoop); the asyncio event
loop only parses, queues and streams, so it never blocks on compute. A request's outputs come back through
its own asyncio queue (server.streaming); a client that goes away has its request aborted and its KV
blocks freed. Models load on demand and unload when idle (server.models). This module builds the app: the
state the routes (server.routes) share, middleware, start-up and shutdown.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import Route

from ..config import EngineConfig
from ..openai.openapi import openapi
from . import adapters, messages, ollama, ollama_manage, ollama_models, page, responses_routes, routes, slots
from .metrics import Metrics
from .models import ModelManager
from .responses_routes import ResponseStore
from .scaffold import LEASES
from .served import ServedModel

DEFAULT_MAX_BODY = 4 * 1024 * 1024


@dataclass
class ServerConfig:
    models: list[str] = field(default_factory=list)  # loaded at start; others load on demand (server.models)
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
    on_demand_speculation: dict | None = None  # the same for models loaded on demand (--speculate lookup)
    models_dirs: list[str] = field(default_factory=list)  # folders whose .gguf files may be served on demand
    # seconds a model stays loaded once idle (negative: forever); None: the default (5 minutes), and the
    # command-line models stay loaded whatever their keep-alive (as llama-server keeps its model)
    keep_alive: float | None = None
    memory_budget_mb: float = 0.0  # 0: none; else the loaded models together (and the runtime) fit it
    # chat replies of models that think: "auto" splits <think> blocks into reasoning_content when the
    # template writes them, "deepseek" always, "none" never (edgeinfer.reasoning)
    reasoning_format: str = "auto"
    allow_pull: bool = False  # Ollama's POST /api/pull may fetch catalog models into the cache
    allow_delete: bool = False  # Ollama's DELETE /api/delete may remove .gguf files under --models-dir
    slot_save_path: str = ""  # llama.cpp's: the folder /slots/ID?action=save|restore write and read ("": off)


class ServerState:
    """What every route reads (request.app.state.server): the config, the model manager (`models`; its
    table of models in memory is `served`), the metrics, the API key as bytes and the OpenAPI document."""

    def __init__(self, config: ServerConfig):
        engine_config = config.engine_config or EngineConfig(threads=config.threads, max_seqs=config.max_seqs,
                                                             backend=config.backend)
        self.config = config
        self.models = ModelManager(config, engine_config)
        self.served: dict[str, ServedModel] = self.models.models  # name -> model in memory (or loading)
        self.responses = ResponseStore()  # the Responses API's, for previous_response_id
        self.metrics = Metrics(self.served, self.models.budget)
        self.api_key = (config.api_key or "").encode("utf-8", "surrogateescape")
        self.openapi_doc = openapi(api_key=bool(config.api_key))

    def start(self) -> None:
        """Load the command-line models in the background (/health says loading until then); on the event loop."""
        self.models.start()

    def stop(self) -> None:
        self.models.stop()


class _ReleaseLeases:
    """Releases whatever model leases a request still holds once its response is over: a streamed
    response whose body Starlette never started (the client left first) never runs the stream's own
    release, and its model must not stay held for ever."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        leases = scope[LEASES] = []
        try:
            await self.app(scope, receive, send)
        finally:
            for lease in leases:
                lease.release()


@asynccontextmanager
async def _lifespan(app):
    app.state.server.start()
    yield
    app.state.server.stop()


ROUTES = [
    Route("/", page.index, methods=["GET", "HEAD"]),  # the chat page; HEAD: a liveness probe
    Route("/v1/chat/completions", routes.chat_completions, methods=["POST"]),
    Route("/v1/completions", routes.completions, methods=["POST"]),
    Route("/v1/embeddings", routes.embeddings, methods=["POST"]),
    Route("/v1/responses", responses_routes.create, methods=["POST"]),  # OpenAI's Responses API
    Route("/v1/responses/input_tokens", responses_routes.input_tokens, methods=["POST"]),
    Route("/v1/responses/{rid}", responses_routes.retrieve, methods=["GET"]),
    Route("/v1/responses/{rid}", responses_routes.delete, methods=["DELETE"]),
    Route("/v1/messages", messages.messages, methods=["POST"]),  # Anthropic's Messages API
    Route("/v1/messages/count_tokens", messages.count_tokens, methods=["POST"]),
    Route("/v1/models", routes.list_models, methods=["GET"]),
    Route("/tokenize", routes.tokenize, methods=["POST"]),
    Route("/detokenize", routes.detokenize, methods=["POST"]),
    Route("/apply-template", routes.apply_template, methods=["POST"]),
    Route("/health", routes.health, methods=["GET"]),
    Route("/api/ps", routes.ps, methods=["GET"]),
    Route("/metrics", routes.metrics, methods=["GET"]),
    Route("/openapi.json", routes.openapi, methods=["GET"]),
    Route("/infill", routes.infill, methods=["POST"]),
    Route("/slots", slots.list_slots, methods=["GET"]),
    Route("/lora-adapters", adapters.list_adapters, methods=["GET"]),
    Route("/lora-adapters", adapters.set_adapters, methods=["POST"]),
    Route("/slots/{id_slot}", slots.slot_action, methods=["POST"]),
    *ollama.ROUTES,
    *ollama_models.ROUTES,
    *ollama_manage.ROUTES,
]


def create_app(config: ServerConfig) -> Starlette:
    state = ServerState(config)
    middleware = [Middleware(_ReleaseLeases)]
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


__all__ = ["ServedModel", "ServerConfig", "ServerState", "create_app"]
