"""Fill-in-the-middle (FIM): a model's FIM tokens, the infill prompt built from them exactly as llama.cpp's
server builds it for /infill, and the llama.cpp-shaped /infill response and stream events.

The tokens come from the GGUF keys `tokenizer.ggml.fim_{pre,suf,mid,pad,rep,sep}_token_id` (or the
deprecated `prefix/suffix/middle_token_id`) and, for those the file does not name, from the vocabulary by
the names llama.cpp's vocabulary loader recognises (src/llama-vocab.cpp). Pure functions over a tokenizer
and a metadata getter: no HTTP, no model weights."""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass

# the spellings llama.cpp's vocabulary loader looks for, per FIM token (the first one present wins)
NAMES = {
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>"),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"),
    "rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "sep": ("<|file_sep|>",),
}
# the GGUF keys, newest first (llama.cpp reads the deprecated ones after, so they win when both are set)
KEYS = {"pre": ("fim_pre", "prefix"), "suf": ("fim_suf", "suffix"), "mid": ("fim_mid", "middle"),
        "pad": ("fim_pad",), "rep": ("fim_rep",), "sep": ("fim_sep",)}
# the other tokens llama.cpp ends a generation on, by name (its EOG set), beside EOS/EOT and FIM pad/rep/sep
EOG_NAMES = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>", "<|endoftext|>",
             "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>")
# llama.cpp's server: the batch its infill prompt is sized to (its default --batch-size, clamped to the
# context as its llama_context clamps it), the repository name and the current file's name it writes
N_BATCH = 2048
REPO_NAME = "myproject"
CURRENT_FILE = "filename"
CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"  # between input_extra chunks when the model has no <|file_sep|>


@dataclass(frozen=True)
class FimTokens:
    """A vocabulary's FIM token ids (None where it has none)."""

    pre: int | None = None
    suf: int | None = None
    mid: int | None = None
    pad: int | None = None
    rep: int | None = None
    sep: int | None = None
    eog_named: tuple[int, ...] = ()  # the vocabulary's tokens llama.cpp ends a generation on by name

    @property
    def can_infill(self) -> bool:
        return None not in (self.pre, self.suf, self.mid)

    @property
    def missing(self) -> list[str]:
        return [n for n, t in (("prefix", self.pre), ("suffix", self.suf), ("middle", self.mid)) if t is None]

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Tokens that end an infill generation beside the tokenizer's own: FIM pad, repo and file
        separator, and llama.cpp's end-of-generation names (a file separator starts another file)."""
        return tuple(sorted({t for t in (self.pad, self.rep, self.sep) if t is not None} | set(self.eog_named)))


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def fim_tokens(tokenizer, metadata) -> FimTokens:
    """The FIM tokens of a vocabulary: `metadata` is the GGUF file (anything with .get(key)); a key names
    a token, else the first of NAMES' spellings the vocabulary holds."""
    n = len(tokenizer.tokens)
    wanted = {name for names in NAMES.values() for name in names} | set(EOG_NAMES)
    found: dict[str, int] = {}
    for i, text in enumerate(tokenizer.tokens):
        if text in wanted and text not in found:
            found[text] = i
    ids = {}
    for field, names in NAMES.items():
        tid = None
        for key in KEYS[field]:
            v = metadata.get(f"tokenizer.ggml.{key}_token_id")
            if v is not None and 0 <= int(v) < n:
                tid = int(v)
        if tid is None:
            tid = next((found[name] for name in names if name in found), None)
        ids[field] = tid
    return FimTokens(**ids, eog_named=tuple(sorted(found[t] for t in EOG_NAMES if t in found)))


def llm_fim_tokens(llm) -> FimTokens:
    """fim_tokens of a loaded edgeinfer.LLM, found once per model (a scan of its vocabulary)."""
    hit = _CACHE.get(llm)
    if hit is None:
        hit = _CACHE[llm] = fim_tokens(llm.tokenizer, llm.gguf)
    return hit


def _tokens(tokenizer, text_or_ids) -> list[int]:
    """Text as tokens (no BOS, special-token text kept as text), or token ids as they are: llama.cpp's
    tokenize_mixed for the prefix and suffix."""
    if isinstance(text_or_ids, str):
        return tokenizer.encode(text_or_ids, False, False)
    return list(text_or_ids)


def infill_prompt(tokenizer, fim: FimTokens, prefix, suffix, extra: list[dict] = (), prompt: str = "", *,
                  n_ctx: int, n_predict: int = -1, n_batch: int = N_BATCH, spm: bool = False) -> list[int]:
    """The token ids llama.cpp's server (format_prompt_infill) builds for an infill request:

        [<|repo_name|>myproject\\n  (<|file_sep|>FILENAME\\nTEXT)*  <|file_sep|>filename\\n]
        [BOS] <|fim_prefix|> PREFIX PROMPT <|fim_suffix|> SUFFIX <|fim_middle|>

    (SPM order, spm=True: the suffix part before the prefix part.) Without <|file_sep|>, extra chunks are
    joined by "\\n\\n--- snippet ---\\n\\n". The prompt text is tokenized with special tokens parsed, the rest
    without. Truncation as llama.cpp's: the prefix keeps its last 3/4 of a batch, the suffix its first
    quarter less the prompt and two tokens, and the extra context its last n_ctx - n_batch - 2 n_predict
    tokens (the batch being min(n_batch, n_ctx)) - and, unlike llama.cpp, never so many that the prompt
    leaves no room to generate in the context. `fim` must have pre, suf and mid (FimTokens.can_infill)."""
    if not fim.can_infill:
        raise ValueError(f"the model has no fill-in-the-middle tokens ({', '.join(fim.missing)} missing)")
    n_batch = min(n_batch, n_ctx)
    tokens_prefix = _tokens(tokenizer, prefix)
    tokens_suffix = _tokens(tokenizer, suffix)
    tokens_prompt = tokenizer.encode(prompt, False, True) if prompt else []

    extra_tokens: list[int] = []
    if fim.rep is not None:
        extra_tokens += [fim.rep, *tokenizer.encode(REPO_NAME + "\n", False, False)]
    for chunk in extra:
        if fim.sep is not None:
            extra_tokens += [fim.sep, *tokenizer.encode(_filename(chunk) + "\n", False, False)]
        else:
            extra_tokens += tokenizer.encode(CHUNK_SEPARATOR, False, False)
        extra_tokens += tokenizer.encode(chunk["text"], False, False)
    if fim.sep is not None:
        extra_tokens += [fim.sep, *tokenizer.encode(CURRENT_FILE + "\n", False, False)]

    n_prefix_take = min(len(tokens_prefix), 3 * (n_batch // 4))
    n_suffix_take = min(len(tokens_suffix), max(0, n_batch // 4 - (2 + len(tokens_prompt))))
    tokens_prefix = [fim.pre, *tokens_prefix[len(tokens_prefix) - n_prefix_take:], *tokens_prompt]
    tokens_suffix = [fim.suf, *tokens_suffix[:n_suffix_take]]
    first, second = (tokens_suffix, tokens_prefix) if spm else (tokens_prefix, tokens_suffix)
    bos = [tokenizer.bos_id] if tokenizer.add_bos and tokenizer.bos_id is not None else []
    core = bos + first + second + [fim.mid]

    n_extra_take = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_tokens))
    n_extra_take = min(n_extra_take, max(0, n_ctx - len(core) - max(n_predict, 1)))  # room to generate
    return (extra_tokens[len(extra_tokens) - n_extra_take:] if n_extra_take else []) + core


def _filename(chunk: dict) -> str:
    name = chunk.get("filename")
    return "tmp" if name is None else name  # llama.cpp's default for a chunk without one


# -- llama.cpp's /infill (and /completion) response shape -----------------------------------------


class Tracker:
    """Wraps a generation's output queue to note what streaming.collect/stream take from it: the token
    ids and when the first one came (for llama.cpp's `timings`)."""

    def __init__(self, queue, t0: float, id_slot: int = 0):
        self.queue, self.t0, self.id_slot = queue, t0, id_slot  # (the slot the request runs in)
        self.ids: list[int] = []
        self.first: float | None = None

    async def get(self):
        out = await self.queue.get()
        if out.new_token_ids and self.first is None:
            self.first = time.monotonic()
        self.ids += out.new_token_ids
        return out

    def timings(self, n_prompt: int) -> dict:
        end = time.monotonic()
        first = self.first or end
        prompt_ms = (first - self.t0) * 1000.0
        predicted_ms = (end - first) * 1000.0
        n = len(self.ids)
        return {"prompt_n": n_prompt, "prompt_ms": prompt_ms,
                "prompt_per_token_ms": prompt_ms / n_prompt if n_prompt else 0.0,
                "prompt_per_second": n_prompt / prompt_ms * 1000.0 if prompt_ms > 0 else 0.0,
                "predicted_n": n, "predicted_ms": predicted_ms,
                "predicted_per_token_ms": predicted_ms / n if n else 0.0,
                "predicted_per_second": n / predicted_ms * 1000.0 if predicted_ms > 0 else 0.0}


def stop_type(reason: str | None, ids: list[int], stop_ids) -> str:
    """llama.cpp's stop_type: "eos" (an end-of-generation token), "word" (a stop string), "limit"
    (n_predict or the context), "none" (not finished)."""
    if reason == "length":
        return "limit"
    if reason == "stop":
        return "eos" if ids and ids[-1] in stop_ids else "word"
    return "none"


def infill_body(name: str, gen, text: str, ids: list[int], reason: str | None, tracker: Tracker, n_ctx: int,
                stop_ids, return_tokens: bool, stream: bool = False) -> dict:
    """The final result of an infill as llama.cpp's server gives it (its /completion shape): `content`
    (empty in the last event of a stream, as llama.cpp's), `stop`, `stop_type`, token counts, timings."""
    p = gen.params
    return {"index": 0, "content": "" if stream else text, "tokens": [] if stream or not return_tokens else ids,
            "id_slot": tracker.id_slot, "stop": True, "model": name, "tokens_predicted": len(ids),
            "tokens_evaluated": len(gen.prompt_ids), "tokens_cached": 0, "truncated": False,
            "has_new_line": "\n" in text, "stop_type": stop_type(reason, ids, stop_ids), "stopping_word": "",
            "generation_settings": {"n_ctx": n_ctx, "n_predict": p.max_tokens, "temperature": p.temperature,
                                    "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p, "seed": p.seed},
            "timings": tracker.timings(len(gen.prompt_ids))}


class InfillChunks:
    """llama.cpp's stream events for /infill (the builder streaming.stream takes, with no usage chunk:
    the final result carries the counts): one {"content", "stop": false, ...} per piece of text, then
    the final result with "stop": true."""

    def __init__(self, name: str, gen, tracker: Tracker, n_ctx: int, stop_ids, return_tokens: bool):
        self.name, self.gen, self.tracker, self.n_ctx = name, gen, tracker, n_ctx
        self.stop_ids, self.return_tokens = stop_ids, return_tokens
        self.text: list[str] = []
        self.sent = 0  # token ids already sent with a piece of text

    def first(self) -> list[dict]:
        return []

    def __call__(self, delta: str | None, finish: str | None, lps: list[dict]) -> list[dict]:
        out = []
        ids = self.tracker.ids
        if delta:
            self.text.append(delta)
            out.append({"index": 0, "content": delta, "tokens": ids[self.sent:] if self.return_tokens else [],
                        "stop": False, "id_slot": self.tracker.id_slot, "tokens_predicted": len(ids),
                        "tokens_evaluated": len(self.gen.prompt_ids)})
            self.sent = len(ids)
        if finish:
            out.append(infill_body(self.name, self.gen, "".join(self.text), ids, finish, self.tracker, self.n_ctx,
                                   self.stop_ids, self.return_tokens, stream=True))
        return out
