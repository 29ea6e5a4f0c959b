"""A local fake of the Hugging Face Hub's HTTP API, for pull tests (no hub is reachable here).

It serves what `edgeinfer pull hf.co/...` asks of the Hub through huggingface_hub and url.py:
- GET /api/models/{org}/{repo}[/revision/{rev}]?blobs=true: the repo's id, commit sha and siblings,
  each with its size and LFS sha256 (HfApi.model_info(files_metadata=True)); an unknown repo is 401
  with X-Error-Code: RepoNotFound, as the Hub answers it, a gated one 403 GatedRepo;
- GET and HEAD /{org}/{repo}/resolve/{rev}/{path}: the file, with ETag, X-Repo-Commit, X-Linked-Etag,
  X-Linked-Size, Content-Length and Accept-Ranges, and Range requests answered 206 with Content-Range.

Knobs per file: `truncate_once` (the next GET sends the full Content-Length but only the first half of
the body, then closes the connection), `fail_after_truncate` (then answers 500 until cleared), and
`wrong_sha` (the listing gives a sha256 that is not the file's); `redirect` sends every file to
/cdn/..., as the Hub sends LFS files to its storage. Every request is recorded as
(method, path, Range header, Authorization header) in `requests`.
"""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    sha: str = "0123456789abcdef0123456789abcdef01234567"  # the commit main points at
    gated: bool = False
    wrong_sha: set[str] = field(default_factory=set)


class FakeHub:
    def __init__(self):
        self.repos: dict[str, FakeRepo] = {}
        self.requests: list[tuple[str, str, str | None, str | None]] = []
        self.truncate_once: set[str] = set()
        self.fail_after_truncate: set[str] = set()
        self.redirect = False  # resolve answers 302 to /cdn/..., as the Hub sends LFS files to its storage
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                hub._handle(self, body=True)

            def do_HEAD(self):
                hub._handle(self, body=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def add(self, repo: str, files: dict[str, bytes], **kw) -> FakeRepo:
        self.repos[repo] = FakeRepo(files, **kw)
        return self.repos[repo]

    def file_gets(self, path_end: str) -> list[str | None]:
        """The Range headers of the GETs of a file (None: the whole file)."""
        return [rng for method, path, rng, _ in self.requests if method == "GET" and path.endswith(path_end)]

    # -- answers --------------------------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        parsed = urllib.parse.urlparse(h.path)
        path = urllib.parse.unquote(parsed.path)
        self.requests.append((h.command, path, h.headers.get("Range"), h.headers.get("Authorization")))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            return self._model_info(h, "/".join(parts[2:4]), parts[5] if len(parts) >= 6 else "main")
        if len(parts) >= 5 and parts[2] == "resolve":
            if self.redirect:
                self._send(h, 302, b"", {"Location": "/cdn" + path, "Content-Type": "text/plain"})
                return
            return self._resolve(h, "/".join(parts[:2]), parts[3], "/".join(parts[4:]), body)
        if parts[0] == "cdn" and len(parts) >= 6 and parts[3] == "resolve":  # the storage: no token asked
            return self._resolve(h, "/".join(parts[1:3]), parts[4], "/".join(parts[5:]), body, storage=True)
        self._send(h, 404, b'{"error": "not found"}', {"Content-Type": "application/json"})

    def _repo_error(self, h, repo_id: str) -> bool:
        repo = self.repos.get(repo_id)
        if repo is None:
            self._send(h, 401, json.dumps({"error": "Repository not found"}).encode(),
                       {"Content-Type": "application/json", "X-Error-Code": "RepoNotFound",
                        "X-Error-Message": "Repository not found"})
            return True
        if repo.gated and not h.headers.get("Authorization"):
            self._send(h, 403, json.dumps({"error": "gated"}).encode(),
                       {"Content-Type": "application/json", "X-Error-Code": "GatedRepo",
                        "X-Error-Message": "Access to this model is restricted"})
            return True
        return False

    def _model_info(self, h, repo_id: str, revision: str) -> None:
        if self._repo_error(h, repo_id):
            return
        repo = self.repos[repo_id]
        siblings = []
        for name, data in sorted(repo.files.items()):
            sha = hashlib.sha256(data).hexdigest()
            if name in repo.wrong_sha:
                sha = hashlib.sha256(b"something else").hexdigest()
            siblings.append({"rfilename": name, "size": len(data), "blobId": hashlib.sha1(data).hexdigest(),
                             "lfs": {"sha256": sha, "size": len(data), "pointerSize": 134}})
        info = {"_id": "fake", "id": repo_id, "modelId": repo_id, "sha": repo.sha, "private": False,
                "gated": repo.gated, "tags": ["gguf"], "siblings": siblings}
        self._send(h, 200, json.dumps(info).encode(), {"Content-Type": "application/json"})

    def _resolve(self, h, repo_id: str, revision: str, filename: str, body: bool, storage: bool = False) -> None:
        if not storage and self._repo_error(h, repo_id):
            return
        repo = self.repos[repo_id]
        data = repo.files.get(filename)
        if data is None or revision not in ("main", repo.sha):
            self._send(h, 404, b'{"error": "Entry not found"}',
                       {"Content-Type": "application/json", "X-Error-Code": "EntryNotFound"})
            return
        sha = hashlib.sha256(data).hexdigest()
        headers = {"ETag": f'"{sha}"', "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data)),
                   "X-Repo-Commit": repo.sha, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        if h.command == "GET" and filename in self.fail_after_truncate and filename not in self.truncate_once:
            self._send(h, 500, b'{"error": "storage unavailable"}', {"Content-Type": "application/json"})
            return
        start = 0
        rng = h.headers.get("Range")
        status = 200
        if rng and rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[len("bytes="):-1])
            if start >= len(data):
                self._send(h, 416, b"", {"Content-Range": f"bytes */{len(data)}"})
                return
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        payload = data[start:]
        if not body:
            self._send(h, status, b"", {**headers, "Content-Length": str(len(payload))}, head=True)
            return
        if filename in self.truncate_once:
            self.truncate_once.discard(filename)
            h.send_response(status)
            for k, v in {**headers, "Content-Length": str(len(payload))}.items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(payload[:len(payload) // 2])
            h.wfile.flush()
            h.close_connection = True
            return
        self._send(h, status, payload, headers)

    @staticmethod
    def _send(h, status: int, payload: bytes, headers: dict, head: bool = False) -> None:
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        if not head:
            h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        if payload and not head:
            h.wfile.write(payload)
