"""Run the server: uvicorn with our own signal handling, so SIGTERM/SIGINT shut down gracefully and
the process exits 0 (uvicorn alone re-raises the signal after its shutdown)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys

import uvicorn

from .app import ServerConfig, create_app


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):
        yield  # handlers are installed by serve(), and they do not re-raise


def serve(config: ServerConfig, host: str = "127.0.0.1", port: int = 8080, shutdown_timeout: float = 10.0,
          log_level: str = "warning") -> int:
    # Until the event loop's handlers are in place, a stop signal during start-up just exits cleanly.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(0))
    if host in ("0.0.0.0", "::"):
        print(f"warning: binding {host} exposes the server to every network this machine is on"
              f"{'' if config.api_key else ', with no API key (--api-key)'}", file=sys.stderr, flush=True)
    app = create_app(config)
    server = _Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                                    timeout_graceful_shutdown=shutdown_timeout, lifespan="on"))

    async def main():
        loop = asyncio.get_running_loop()

        def on_signal():
            if server.should_exit:
                server.force_exit = True  # a second signal: stop waiting for in-flight requests
            server.should_exit = True

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        names = ", ".join(app.state.served)
        print(f"edgeinfer serving on http://{host}:{port} " + (f"(models: {names}; loading in the background, /health "
              "says when ready)" if names else "(no model loaded yet: each loads when a request names it)"),
              file=sys.stderr, flush=True)
        await server.serve()

    asyncio.run(main())
    return 0 if server.started else 1
