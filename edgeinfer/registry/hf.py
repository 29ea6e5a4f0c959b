"""Hugging Face pulls: `hf.co/ORG/REPO[:QUANT]` (as `ollama pull hf.co/...` and `llama-server -hf` take
them; also `huggingface.co/...` and the repo's https page) and `hf://ORG/REPO/FILE.gguf` for one file.

huggingface_hub (the `hf` extra) lists the repo's files with their sizes and LFS sha256, and gives the
file's URL and the request headers (HF_ENDPOINT, HF_TOKEN or a `hf auth login` token). The bytes come
through url.py's resumable download into a hidden .partial file named after the expected sha256, so an
interrupted pull resumes on the next run (huggingface_hub itself drops a partial download); only a file
whose size and sha256 match the Hub's listing is renamed into the cache.

A QUANT picks the GGUF file whose path holds the tag, case-insensitively, followed by '.' or '-'
(`Q4_K_M` matches `x-Q4_K_M.gguf`, `x.q4_k_m.gguf` and `Q4_K_M/x-00001-of-00002.gguf`), as llama.cpp
does; projectors and importance matrices (mmproj, imatrix) are never the model. Without one (or with
`:latest`), as llama.cpp's `-hf`: Q4_K_M, else Q8_0, else the first GGUF model file. Files split into
parts (`-00001-of-00003.gguf`) are refused: edgeinfer reads one-file models.

A repo with a vision projector (an `mmproj` GGUF) gives it too, as `-hf` does: the one in the model's folder or
above it, the deepest first, then the one whose quant's bits are nearest the model's (llama.cpp's
find_best_mmproj); it is kept beside the model as NAME.mmproj.gguf (cache.projector_for), and the model loads
with it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .cache import _cache_file, _check_gguf, _no_link, _pull_once, _sha256, models_dir
from .catalog import _stem
from .errors import PullError
from .refs import HFRef
from .url import _fetch_resumable

_SPLIT_RE = re.compile(r"^(.+)-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
_NOT_MODEL = ("mmproj", "imatrix")  # GGUF files in model repos that are not the language model
_DEFAULT_TAGS = ("Q4_K_M", "Q8_0")  # llama.cpp's -hf choice when no quant is given
_INSTALL = "pip install 'edgeinfer[hf]'"


# -- which file --------------------------------------------------------------------------------------


def _is_model(path: str) -> bool:
    base = path.rsplit("/", 1)[-1].lower()
    return base.endswith(".gguf") and not any(k in base for k in _NOT_MODEL)


def _tag_matches(path: str, tag: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(tag)}(?=[.-])", path, re.IGNORECASE) is not None


def _refuse_split(repo: str, path: str, files: list[str]) -> None:
    m = _SPLIT_RE.match(path)
    if m:
        parts = [f for f in files if (s := _SPLIT_RE.match(f)) and s.group(1) == m.group(1)]
        raise PullError(f"{path} in {repo} is one of {int(m.group(3))} split parts ({', '.join(sorted(parts))}); "
                        "edgeinfer reads one-file GGUF models: merge them with `llama-gguf-split --merge` and pull "
                        "the merged file by its path")


def choose_file(repo: str, files: list[str], quant: str | None) -> str:
    """The repo's GGUF model file for `quant` (see the module's docstring); a one-line PullError listing
    the repo's GGUF files when none or several match, or when the match is split into parts."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf"))
    models = [f for f in ggufs if _is_model(f)]
    have = ", ".join(ggufs) if ggufs else "none"
    if not models:
        raise PullError(f"{repo} has no GGUF model file (its GGUF files: {have})")
    hits: list[str] = []
    for tag in ([quant] if quant else _DEFAULT_TAGS):
        hits = [f for f in models if _tag_matches(f, tag)]
        if hits:
            break
    if not hits:
        if quant:
            raise PullError(f"{repo} has no GGUF file for quant {quant}; its GGUF files: {have}")
        hits = models[:1]  # as llama.cpp: the first model file
    firsts = [f for f in hits if not (m := _SPLIT_RE.match(f)) or int(m.group(2)) == 1]
    if len(firsts) > 1:
        raise PullError(f"{quant or hits[0]} matches several GGUF files in {repo}: {', '.join(firsts)}; "
                        f"pull one with hf://{repo}/FILE.gguf")
    chosen = (firsts or hits)[0]
    _refuse_split(repo, chosen, models)
    return chosen


def _quant_bits(path: str) -> int:
    # llama.cpp's extract_quant_bits: the digits of the name's last [-.]-separated tag (Q4_K_M 4, F16 16), else 0
    split = _SPLIT_RE.match(path)
    stem = split.group(1) if split else path[:-5]
    m = re.search(r"[-.]([A-Za-z0-9_]+)$", stem)
    digits = re.search(r"\d+", m.group(1)) if m else None
    return int(digits.group(0)) if digits else 0


def choose_projector(files: list[str], model: str) -> str | None:
    """The vision projector to pull with `model` from a repo's files, or None (see the module's docstring)."""
    model_dirs = model.split("/")[:-1]
    bits = _quant_bits(model)
    best = None
    for f in files:
        if not f.endswith(".gguf") or "mmproj" not in f:
            continue
        dirs = f.split("/")[:-1]
        if dirs != model_dirs[:len(dirs)]:
            continue
        key = (len(dirs), -abs(_quant_bits(f) - bits))
        if best is None or key > best[0]:
            best = (key, f)
    return best[1] if best else None


# -- the pull ----------------------------------------------------------------------------------------


def _hub():
    try:
        import huggingface_hub
    except ImportError:
        raise PullError(f"pulling from Hugging Face needs huggingface_hub: {_INSTALL}") from None
    return huggingface_hub


def _endpoint() -> str:
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def _list_files(hub, ref: HFRef, endpoint: str) -> tuple[str, dict[str, tuple[int | None, str | None]]]:
    """(the revision's commit, {file: (size, LFS sha256)}) of the repo, as the Hub lists them."""
    from huggingface_hub import errors

    where = f"{ref.repo} on {endpoint}"
    try:
        info = hub.HfApi(endpoint=endpoint).model_info(ref.repo, revision=ref.revision, files_metadata=True)
    except errors.GatedRepoError:
        raise PullError(f"{ref.repo} is gated: accept its terms on the Hub, then set HF_TOKEN to a token of that "
                        "account") from None
    except errors.RepositoryNotFoundError:
        raise PullError(f"no model repository {where} (a private one needs HF_TOKEN)") from None
    except errors.RevisionNotFoundError:
        raise PullError(f"{ref.repo} has no revision {ref.revision!r}") from None
    except errors.HfHubHTTPError as e:
        raise PullError(f"listing {where} failed: {_first_line(e)}") from None
    except Exception as e:  # the network, offline mode, an answer that is not the Hub's
        raise PullError(f"cannot list {where}: {type(e).__name__}: {_first_line(e)}") from None
    files = {}
    for s in info.siblings or []:
        lfs = s.lfs
        files[s.rfilename] = (lfs.size if lfs else s.size, lfs.sha256 if lfs else None)
    return info.sha or ref.revision, files


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


def _partial_path(final: Path, key: str) -> Path:
    """The download's hidden .partial file, named after what it is to become, so that a partial of an
    older file is never resumed into a newer one; partials of other versions of this model are removed."""
    partial = final.with_name(f".{final.stem}.{key[:16]}.partial")
    pattern = re.compile(rf"^\.{re.escape(final.stem)}\.[0-9A-Za-z]{{1,16}}\.partial$")
    for old in models_dir().glob(f".{final.stem}.*.partial"):
        if old != partial and pattern.match(old.name):
            old.unlink(missing_ok=True)
    return _no_link(partial)


def pull_hf(ref: HFRef, *, name: str | None, progress: bool, force: bool, timeout: float = 60.0) -> Path:
    final = _cache_file(_stem(name) if name else ref.name, write=True)
    if final.is_file() and not force:
        return final
    hub = _hub()

    def clean_up():
        for partial in models_dir().glob(f".{final.stem}.*.partial"):
            partial.unlink(missing_ok=True)
        for partial in models_dir().glob(f".{final.stem}.mmproj.*.partial"):
            partial.unlink(missing_ok=True)

    return _pull_once(final, final.name, progress, force,
                      lambda: _pull_hf_locked(hub, ref, final, progress, timeout), clean_up)


def _pull_hf_locked(hub, ref: HFRef, final: Path, progress: bool, timeout: float) -> Path:
    endpoint = _endpoint()
    commit, files = _list_files(hub, ref, endpoint)
    jobs: list[tuple[str, Path]] = []
    if ref.filename is not None:
        if ref.filename not in files:
            have = ", ".join(sorted(f for f in files if f.lower().endswith(".gguf"))) or "none"
            raise PullError(f"{ref.repo} has no file {ref.filename}; its GGUF files: {have}")
        _refuse_split(ref.repo, ref.filename, list(files))
        filename = ref.filename
    else:
        filename = choose_file(ref.repo, list(files), ref.quant)
        projector = choose_projector(list(files), filename)
        if projector is not None:
            jobs.append((projector, final.with_name(final.stem + ".mmproj.gguf")))
    jobs.insert(0, (filename, final))
    got = [_download(hub, ref, commit, endpoint, f, files[f], dest, progress, timeout) for f, dest in jobs]
    try:  # every file checked before any is installed: a bad one leaves nothing (its partial removed)
        for partial, _, check in got:
            check()
            _check_gguf(partial)
    except PullError:
        for partial, _, _ in got:
            partial.unlink(missing_ok=True)
        raise
    for partial, dest, _ in reversed(got):  # the projector first: the model's file in the cache means both
        os.replace(partial, dest)
    return final


def _download(hub, ref: HFRef, commit: str, endpoint: str, filename: str, listed: tuple, final: Path,
              progress: bool, timeout: float) -> tuple[Path, Path, object]:
    """One file of the repo downloaded (resumable) into its partial file: (partial, final, check), check() raising
    a PullError unless its size and sha256 are the Hub's."""
    from huggingface_hub.utils import build_hf_headers

    size, sha256 = listed
    url = hub.hf_hub_url(ref.repo, filename, revision=commit, endpoint=endpoint)
    headers = build_hf_headers(library_name="edgeinfer")  # the token, from HF_TOKEN or a login
    partial = _partial_path(final, sha256 or commit)
    got = _fetch_resumable(url, partial, filename.rsplit("/", 1)[-1], progress, timeout, headers=headers)

    def check():
        if size is not None and got != size:
            raise PullError(f"size mismatch for {filename} from {ref.repo}: got {got} bytes, the Hub lists {size}; "
                            "nothing was saved")
        if sha256 is not None:
            digest = _sha256(partial).hexdigest()
            if digest != sha256:
                raise PullError(f"sha256 mismatch for {filename} from {ref.repo}: got {digest}, the Hub lists "
                                f"{sha256}; nothing was saved")

    return partial, final, check
