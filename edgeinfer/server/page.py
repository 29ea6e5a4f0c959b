"""The chat page at `/`, as llama.cpp's server has one: a single HTML file with its CSS and JS inline
(static/chat.html, installed as package data), which talks only to this server's own API. It needs no API
key (it holds no data; its API calls send the key). `HEAD /` answers 200 as well: Ollama's clients probe it
to see that a server is up."""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from importlib import resources

from starlette.requests import Request
from starlette.responses import Response

_INLINE = {"script": re.compile(r"<script>(.*?)</script>", re.S), "style": re.compile(r"<style>(.*?)</style>", re.S)}


def page_html() -> str:
    """The page's text, read from the installed package."""
    return resources.files("edgeinfer.server").joinpath("static", "chat.html").read_text("utf-8")


def content_security_policy(html: str) -> str:
    """This origin only; the page's own inline script and style allowed by their sha256 hashes, never by
    'unsafe-inline', so that model text that ever became markup still could not run or load anything."""
    def hashes(kind: str) -> str:
        return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()}'"
                        for body in _INLINE[kind].findall(html))

    return ("default-src 'self'; "
            f"script-src {hashes('script')}; "
            f"style-src {hashes('style')}; "
            "img-src 'self' data:; "  # data: for the empty favicon, so the browser asks for no /favicon.ico
            "connect-src 'self'; "
            "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


@functools.lru_cache(maxsize=1)
def _page() -> tuple[bytes, dict[str, str]]:
    html = page_html()
    return html.encode("utf-8"), {
        "Content-Security-Policy": content_security_policy(html),
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    }


async def index(request: Request) -> Response:
    """GET /: the chat page; HEAD /: the same headers, no body (a liveness probe)."""
    body, headers = _page()
    return Response(body if request.method == "GET" else b"", media_type="text/html; charset=utf-8",
                    headers={**headers, "Content-Length": str(len(body))})
