"""`edgeinfer`: the click application. Thin: parse, call edgeinfer, print."""

from __future__ import annotations

import json
import sys

import click

from edgeinfer import registry
from edgeinfer.errors import EdgeInferError
from edgeinfer.gguf_file import GGUFError

from .common import kv_type_options


class _Group(click.Group):
    """Turns the runtime's user-facing errors into one line on stderr and exit status 1."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (EdgeInferError, GGUFError, ValueError) as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="edgeinfer")
def main():
    """edgeinfer: run quantized GGUF language models on the CPU."""


def _open_model_file(model: str):
    from edgeinfer.gguf_file import GGUFFile

    return GGUFFile(registry.resolve(model, pull_missing=False))


@main.command()
@click.argument("source")
@click.option("--name", help="Name to store a URL or local file under (default: its file name).")
@click.option("--force", is_flag=True, help="Download again even if the model is already cached.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def pull(source, name, force, quiet):
    """Fetch a model: a catalog name, hf.co/ORG/REPO[:QUANT] or hf://ORG/REPO/FILE.gguf (Hugging Face), an
    http(s) URL (resumable) or a local .gguf path."""
    path = registry.pull(source, progress=not quiet, force=force, name=name)
    click.echo(f"{path}")


@main.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_(as_json):
    """List downloaded models and the catalog."""
    from edgeinfer.info import quant_mix, summarize
    from edgeinfer.gguf_file import GGUFFile

    rows = []
    for m in registry.list_local():
        try:
            with GGUFFile(m.path) as gf:
                s = summarize(gf)
            rows.append({"name": m.name, "size": m.size, "architecture": s["architecture"],
                         "quant_mix": quant_mix(s), "path": str(m.path)})
        except GGUFError as e:
            rows.append({"name": m.name, "size": m.size, "architecture": "?", "quant_mix": f"invalid: {e}",
                         "path": str(m.path)})
    from edgeinfer.registry import created

    made, damaged = created.list_all()
    made = [{"name": c.name, "from": c.base, "path": c.file, "own_file": c.own_file,
             "system": c.system is not None, "parameters": c.parameters} for c in made]
    if as_json:
        click.echo(json.dumps({"models": rows, "created": made, "damaged": damaged,
                               "catalog": sorted(registry.CATALOG)}))
        return
    if rows:
        click.echo(f"{'NAME':<28} {'SIZE':>9}  {'ARCH':<8} {'QUANT MIX':<36} PATH")
        for r in rows:
            click.echo(f"{r['name']:<28} {r['size'] / 1e6:>7.1f}MB  {r['architecture']:<8} {r['quant_mix']:<36} {r['path']}")
    else:
        click.echo(f"no models downloaded yet (cache: {registry.models_dir()})")
    if made or damaged:
        click.echo("\ncreated (Ollama's /api/create and /api/copy on `edgeinfer serve`; no weights copied):")
        for c in made:
            click.echo(f"  {c['name']:<28} from {c['from']:<28} {c['path']}")
        for d in damaged:
            click.echo(f"  damaged: {d}")
    have = {r["name"] for r in rows}
    click.echo("\ncatalog (edgeinfer pull NAME):")
    for e in registry.CATALOG.values():
        mark = f"{e.size / 1e6:,.0f} MB" + (", downloaded" if e.name in have else "")
        click.echo(f"  {e.name:<28} {e.description} [{mark}]")


@main.command()
@click.argument("model")
def rm(model):
    """Delete a downloaded model from the cache, or a created model (its manifest, and its own file)."""
    from edgeinfer.registry import created

    if model in created.names():
        users = created.standing_on(model)
        if users:
            raise click.ClickException(f"{', '.join(users)} {'is' if len(users) == 1 else 'are'} made over "
                                       f"{model}'s quantized file: remove them first")
        c = created.delete(model)
        click.echo(f"removed created model {model}" + (f" and its file {c.file}" if c.own_file else ""))
        return
    try:
        target = registry.resolve(model, pull_missing=False, progress=False)
    except EdgeInferError:
        target = None
    users = created.over(target) if target is not None else []
    if users:
        raise click.ClickException(f"{', '.join(users)} {'is' if len(users) == 1 else 'are'} made over {model}'s "
                                   "file: remove them first")
    path = registry.remove(model)
    click.echo(f"removed {path}")


def _inspect_projector(gf, s: dict, as_json: bool, memory: bool) -> None:
    from dataclasses import asdict

    from edgeinfer.models.clip import config_from_gguf, memory_bytes

    cfg = config_from_gguf(gf)
    out = {"path": s["path"], "file_size": s["file_size"], "architecture": "clip (vision projector)",
           **{k: v for k, v in asdict(cfg).items() if k not in ("mean", "std")},
           "rows_per_image": cfg.tokens_per_image, "parameters": s["parameters"]}
    if memory:
        out["memory"] = {k + "_mb": round(v / 2**20, 2) for k, v in memory_bytes(gf.path).items()}
    if as_json:
        click.echo(json.dumps(out))
        return
    width = max(len(k) for k in out)
    for k, v in out.items():
        click.echo(f"{k:<{width}}  {v}")


@main.command()
@click.argument("model")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--memory", is_flag=True, help="Estimate the memory a run needs: weights, KV per 1k tokens, buffers.")
@click.option("--max-context", type=click.IntRange(0, None), default=0,
              help="Context for --memory's pool (0: as a run sizes it, by the memory available).")
@click.option("--max-seqs", type=click.IntRange(0, None), default=0,
              help="Sequences at once for --memory (0: sized for the cores, as the engine does).")
@kv_type_options
def inspect(model, as_json, memory, kv_type, max_context, max_seqs):
    """Show a model's architecture, sizes, tokenizer and tensor types (--memory: what a run needs)."""
    from edgeinfer.info import summarize

    with _open_model_file(model) as gf:
        s = summarize(gf)
        if gf.metadata.get("general.architecture") == "clip":  # a vision projector (mmproj)
            return _inspect_projector(gf, s, as_json, memory)
        if memory:
            from edgeinfer import memory as mem
            from edgeinfer.file_estimate import estimate_file
            from edgeinfer.config import EngineConfig

            config = EngineConfig(kv_dtype=kv_type or "", max_context=max_context, max_seqs=max_seqs)
            why = "--max-context"
            if not max_context:  # as a run would size it: by the memory available now
                from edgeinfer.file_estimate import context_for_memory

                config, why = context_for_memory(gf, config)
            s["memory"] = {**mem.report(estimate_file(gf, config), config), "context_from": why}
    if as_json:
        click.echo(json.dumps(s))
        return
    width = max(len(k) for k in s)
    for k, v in s.items():
        if k in ("tensor_types", "tensor_bytes", "memory"):
            continue
        if k in ("parameters", "active_parameters"):
            v = f"{v:,} ({_short_count(v)})"
        click.echo(f"{k:<{width}}  {v}")
    click.echo("tensors by type:")
    from edgeinfer.quant.repack import WIDENED
    from edgeinfer.kernels import kinds

    notes = {t.name: f"  (loaded as {kinds.name(k)}: see inspect --memory)" for t, k in WIDENED.items()}
    for t, n in s["tensor_types"].items():
        note = notes.get(t, "")
        click.echo(f"  {t:<6} {n:>5} tensors  {s['tensor_bytes'][t] / 1e6:>9.2f} MB{note}")
    if memory:
        m = s["memory"]
        click.echo("memory estimate (MB = 2**20 bytes):")
        rows = [("weights", m["weights_mb"])]
        window = "window_kv_mb_per_seq" in m  # sliding-window layers: a window per sequence, not per token
        per_1k = "KV per 1k tokens (full layers)" if window else "KV per 1k tokens"
        rows += [(f"{per_1k}, {t}", v) for t, v in m["kv_mb_per_1k_tokens"].items()]
        if window:
            rows.append((f"sliding-window layers: {m['window_kv_tokens_per_seq']} tokens a sequence, and a step's "
                         f"{m['window_kv_step_tokens']}", None))
            rows += [(f"window KV per sequence, {t}", v) for t, v in m["window_kv_mb_per_seq"].items()]
        rows += [("step buffers", m["buffers_mb"]), ("runtime (Python, Numba)", m["runtime_mb"]),
                 (f"KV pool: {m['max_context']} tokens, {m['default_kv_type']}", m["default_kv_pool_mb"])]
        if window:
            rows.append((f"  of which window pool ({m['window_kv_seqs']} windows, a step)", m["window_kv_pool_mb"]))
        if "active_weights_mb" in m:  # MoE: what decoding one token reads, its experts' share of the weights
            rows.insert(1, ("weights read per token (MoE)", m["active_weights_mb"]))
        if "recurrent_state_mb" in m:  # a hybrid model: a fixed state per running sequence, not per token
            rows.append((f"recurrent state, {m['recurrent_state_seqs']} x {m['recurrent_state_mb_per_seq'] * 1024:.0f} KB",
                         m["recurrent_state_mb"]))
        width = max(32, *(len(label) for label, v in rows if v is not None))
        for label, v in rows:
            click.echo(f"  {label:<{width}} {v:>8.1f} MB" if v is not None else f"  {label}")
        click.echo(f"  {'total when all is resident':<{width}} {m['total_mb']:>8.1f} MB")
        click.echo(f"  context {m['max_context']} tokens: {m['context_from']}")


def _short_count(n: int) -> str:
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)


# the commands that run or build models, one module each (their heavy imports wait until they run)
from .bench import bench  # noqa: E402
from .chat import chat  # noqa: E402
from .embed import embed  # noqa: E402
from .generate import generate  # noqa: E402
from .imatrix import imatrix  # noqa: E402
from .perplexity import perplexity  # noqa: E402
from .ps import ps  # noqa: E402
from .quantize_model import quantize_model_cmd  # noqa: E402
from .serve import serve  # noqa: E402
from .system import system  # noqa: E402
from .warmup import warmup  # noqa: E402

for _cmd in (generate, chat, embed, perplexity, imatrix, warmup, bench, serve, ps, system):
    main.add_command(_cmd)
main.add_command(quantize_model_cmd, "quantize-model")
main.add_command(quantize_model_cmd, "quantize")  # short alias

from .batch import batch  # noqa: E402
from .bench_serve import bench_serve  # noqa: E402

main.add_command(bench_serve)
main.add_command(batch)


if __name__ == "__main__":
    main()
