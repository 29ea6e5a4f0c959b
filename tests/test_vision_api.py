"""Images through the surfaces: `serve --mmproj` (OpenAI's image_url parts, Ollama's images, /api/show's vision
capability, the 400s), `generate --image` and `chat`'s /image, on the random SmolVLM-shaped pair of
tests/vision_zoo.py (its encoder and prompts are checked against libmtmd in test_vision.py)."""

import base64
import io

import httpx
import pytest
from click.testing import CliRunner
from test_server import Server

import vision_zoo
from edgeinfer import LLM, SamplingParams
from edgeinfer.cli.main import main


def _png(h=40, w=60, seed=7) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(vision_zoo.test_image(h, w, seed)).save(buf, "PNG")
    return buf.getvalue()


PNG = _png()
B64 = base64.b64encode(PNG).decode()
URL = "data:image/png;base64," + B64


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("vision_api")
    text, proj = vision_zoo.write_pair("idefics3", d)
    plain = d / "plain.gguf"
    vision_zoo.write_tiny_llama(plain, seed=5)
    img = d / "cat.png"
    img.write_bytes(PNG)
    return {"text": text, "proj": proj, "plain": str(plain), "image": str(img)}


@pytest.fixture(scope="module")
def server(files):
    s = Server(files["text"], files["plain"], "--mmproj", f"idefics3-text={files['proj']}").wait_ready(timeout=120)
    yield s
    s.stop()


def _chat(server, model, content, **kw):
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 5, "temperature": 0,
            **kw}
    return httpx.post(server.base + "/v1/chat/completions", json=body, timeout=120)


PARTS = [{"type": "text", "text": "What is in the picture?"}, {"type": "image_url", "image_url": {"url": URL}}]


def test_openai_chat_with_an_image_is_the_python_apis_answer(server, files):
    r = _chat(server, "idefics3-text", PARTS)
    assert r.status_code == 200, r.text
    got = r.json()
    llm = LLM(files["text"], mmproj=files["proj"], progress=False)
    msgs = [{"role": "user", "content": PARTS}]
    want = llm.chat(msgs, SamplingParams(temperature=0, max_tokens=5))
    assert got["choices"][0]["message"]["content"] == want.text
    assert got["usage"]["prompt_tokens"] == len(llm.chat_prompt(msgs)) == len(want.prompt_token_ids)
    # streamed: the same text
    with httpx.stream("POST", server.base + "/v1/chat/completions", timeout=120,
                      json={"model": "idefics3-text", "messages": msgs, "max_tokens": 5, "temperature": 0,
                            "stream": True}) as s:
        import json

        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    assert text == want.text
    # the same image again: its rows come from the prefix cache
    again = _chat(server, "idefics3-text", PARTS, max_tokens=2).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= 64


@pytest.mark.parametrize("model, content, status, message", [
    ("plain", PARTS, 400, "has no vision projector"),
    ("idefics3-text", [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}], 400,
     "not fetched (the server's --allow-image-urls"),
    ("idefics3-text", [{"type": "image_url", "image_url": "/etc/hostname"}], 400, "must be a data: URL"),  # no file
    ("idefics3-text", [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@"}}], 400,
     "not valid base64"),
    ("idefics3-text", [{"type": "image_url", "image_url": {"url": "data:image/png;base64," +
                                                          base64.b64encode(b"not a png").decode()}}], 400,
     "not an image"),
    ("idefics3-text", [{"type": "image_url", "image_url": 7}], 400, "content"),
])
def test_bad_images_are_400s(server, model, content, status, message):
    r = _chat(server, model, content)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]["message"]


def test_ollama_images(server):
    base = {"model": "idefics3-text", "stream": False, "options": {"temperature": 0, "num_predict": 4}}
    r = httpx.post(server.base + "/api/chat", timeout=120, json={
        **base, "messages": [{"role": "user", "content": "What is in the picture?", "images": [B64]}]})
    assert r.status_code == 200, r.text
    assert r.json()["eval_count"] >= 1
    g = httpx.post(server.base + "/api/generate", timeout=120, json={**base, "prompt": "Describe", "images": [B64]})
    assert g.status_code == 200, g.text
    assert g.json()["prompt_eval_count"] > 64  # the image's 5 x 16 rows and their tokens
    bad = httpx.post(server.base + "/api/generate", timeout=120,
                     json={**base, "prompt": "Describe", "images": [B64], "raw": True})
    assert bad.status_code == 400 and "not with 'raw'" in bad.json()["error"]
    plain = httpx.post(server.base + "/api/chat", timeout=120, json={
        **base, "model": "plain", "messages": [{"role": "user", "content": "hi", "images": [B64]}]})
    assert plain.status_code == 400 and "no vision projector" in plain.json()["error"]
    caps = httpx.post(server.base + "/api/show", json={"model": "idefics3-text"}).json()["capabilities"]
    assert "vision" in caps
    assert "vision" not in httpx.post(server.base + "/api/show", json={"model": "plain"}).json()["capabilities"]


def test_anthropic_messages_with_an_image_block(server):
    # Messages' image blocks (base64 source) read as OpenAI's image_url parts: the same answer
    blocks = [{"type": "text", "text": "What is in the picture?"},
              {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": B64}}]
    r = httpx.post(server.base + "/v1/messages", timeout=120, json={
        "model": "idefics3-text", "max_tokens": 5, "temperature": 0, "messages": [{"role": "user", "content": blocks}]})
    assert r.status_code == 200, r.text
    want = _chat(server, "idefics3-text", PARTS).json()["choices"][0]["message"]["content"]
    assert "".join(b.get("text", "") for b in r.json()["content"]) == want


def test_cli_generate_with_an_image(files):
    run = CliRunner().invoke(main, ["generate", files["text"], "Describe:", "--mmproj", files["proj"], "--image",
                                    files["image"], "--max-tokens", "4", "--temperature", "0", "--json"])
    assert run.exit_code == 0, run.output
    import json

    out = json.loads(run.output.strip().splitlines()[-1])
    assert out["prompt_tokens"] > 64 and out["completion_tokens"] >= 1
    no = CliRunner().invoke(main, ["generate", files["text"], "Describe:", "--image", files["image"]])
    assert no.exit_code != 0 and "--image needs the model's vision projector" in no.output


def test_cli_chat_image_command(files, tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"nope")
    run = CliRunner().invoke(main, ["chat", files["text"], "--mmproj", files["proj"], "--max-tokens", "3"],
                             input=f"/image {bad}\n/image {files['image']}\nWhat is it?\n")
    assert run.exit_code == 0, run.output
    assert "not an image" in run.output
    assert "(image " in run.output and "60x40" in run.output


def test_allow_image_urls_fetches_http_images(files):
    # with --allow-image-urls an http(s) image is fetched (a local server here), and its answer is the data: URL's
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/cat.png":
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.end_headers()
                self.wfile.write(PNG)
            else:
                self.send_error(404)

        def log_message(self, *args):
            pass

    images = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=images.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{images.server_address[1]}"
    s = Server(files["text"], "--mmproj", files["proj"], "--allow-image-urls").wait_ready(timeout=120)
    try:
        by_url = _chat(s, "idefics3-text", [PARTS[0], {"type": "image_url", "image_url": {"url": base + "/cat.png"}}])
        assert by_url.status_code == 200, by_url.text
        by_data = _chat(s, "idefics3-text", PARTS)
        assert by_url.json()["choices"][0]["message"] == by_data.json()["choices"][0]["message"]
        missing = _chat(s, "idefics3-text", [{"type": "image_url", "image_url": {"url": base + "/nope.png"}}])
        assert missing.status_code == 400 and "HTTP 404" in missing.json()["error"]["message"]
    finally:
        s.stop()
        images.shutdown()
