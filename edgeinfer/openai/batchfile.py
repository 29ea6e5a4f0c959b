"""OpenAI's batch file format, without files or engines: an input line, {"custom_id", "method": "POST",
"url", "body"}, read as a request (or a 400 naming what is wrong with it), and an output line, {"id",
"custom_id", "response": {"status_code", "request_id", "body"}, "error"}. edgeinfer.batch reads and
writes the files and runs the requests."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from . import protocol as P

URLS = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/embeddings": "embeddings"}
MAX_CUSTOM_ID = 512  # characters


@dataclass
class Item:
    """One input line: a request, or why it is not one (error, with custom_id when it could be read)."""

    line: int  # 1-based
    custom_id: str | None
    kind: str | None = None  # "chat" | "completions" | "embeddings"
    body: dict | None = None
    error: P.APIError | None = None

    @property
    def key(self) -> str | tuple:
        """What the output knows this line by: its custom_id, or ("line", n) when it has none."""
        return self.custom_id if self.custom_id is not None else ("line", self.line)


_CUSTOM_ID = re.compile(rb'"custom_id"\s*:\s*("(?:[^"\\]|\\.)*")')


def parse_line(n: int, raw: bytes) -> Item:
    """Input line n as an Item; a line that is not a request carries a 400 naming the problem."""
    def fail(message: str, param: str | None = None, custom_id=None, status: int = 400) -> Item:
        return Item(n, custom_id, error=P.APIError(status, f"line {n}: {message}", param=param))

    try:
        obj = P.loads(raw)
    except P.APIError as e:
        m = _CUSTOM_ID.search(raw)  # still name the request when its custom_id can be read
        cid = None
        if m:
            try:
                cid = json.loads(m.group(1))
            except ValueError:
                pass
        return fail(e.message.replace("the request body", "the line"), custom_id=cid if isinstance(cid, str) else None)
    if not isinstance(obj, dict):
        return fail("a request line must be a JSON object")
    cid = obj.get("custom_id")
    if not isinstance(cid, str) or not cid or len(cid) > MAX_CUSTOM_ID:
        return fail(f"'custom_id' must be a non-empty string of at most {MAX_CUSTOM_ID} characters", "custom_id")
    unknown = sorted(set(obj) - {"custom_id", "method", "url", "body"})
    if unknown:
        return fail(f"unknown field {unknown[0]!r}: a request line has custom_id, method, url and body",
                    unknown[0], cid)
    if obj.get("method") != "POST":
        return fail(f"'method' must be \"POST\", got {obj.get('method')!r}", "method", cid)
    url = obj.get("url")
    if url not in URLS:
        return fail(f"unknown url {url!r}: a batch takes {', '.join(URLS)}", "url", cid, status=404)
    body = obj.get("body")
    if not isinstance(body, dict):
        return fail("'body' must be a JSON object: the request body", "body", cid)
    return Item(n, cid, URLS[url], body)


def record(item: Item, status: int, body: dict, error: dict | None = None) -> dict:
    """An output line, as OpenAI's batch output."""
    return {"id": f"batch_req_{uuid.uuid4().hex[:24]}", "custom_id": item.custom_id,
            "response": {"status_code": status, "request_id": f"req_{uuid.uuid4().hex[:24]}", "body": body},
            "error": error}


def error_record(item: Item, e) -> dict:
    """A failed request's line: the HTTP status and OpenAI error body the server would send, and `error`
    ({code, message, line}) so failures are one `select(.error)` away."""
    return record(item, e.status, e.body(), {"code": e.code or e.type, "message": e.message, "line": item.line})
