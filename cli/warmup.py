"""`edgeinfer warmup`: compile kernels ahead of time, and export or import packs of them."""

from __future__ import annotations

import os
import time

import click

from edgeinfer import registry
from edgeinfer.config import KV_TYPES


@click.command()
@click.argument("models", nargs=-1)
@click.option("--kv-type", "kv_types", type=click.Choice(KV_TYPES), multiple=True,
              help="KV types to compile for (repeatable; default: the default one; with --all: every one).")
@click.option("--all", "all_kernels", is_flag=True,
              help="Every kernel unit of this machine's ISA tier: every weight kind and KV type (then MODELS).")
@click.option("--export", "export_path", type=click.Path(dir_okay=False), default=None,
              help="Then pack this tier's compiled kernels into FILE (.tar.gz) for other machines of the tier.")
@click.option("--import", "import_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Install a pack made by --export on a machine of the same tier; nothing is compiled.")
@click.option("--clear", is_flag=True,
              help="Empty the kernel cache (every tier and version) and the weight layouts first.")
def warmup(models, kv_types, all_kernels, export_path, import_path, clear):
    """Compile the kernels MODELS need (default: smollm2-135m-instruct) into the kernel cache, ahead of time,
    in one worker process per core.

    Kernels are compiled for each model's own weight types and KV type, so a run of a model with other
    types compiles once more; --all compiles every kind. A pack from --export serves every machine of the
    same ISA tier, Numba and edgeinfer version (`edgeinfer system` names the tier): an edge fleet compiles
    once and copies the pack to every device."""
    from edgeinfer.kernels.cpu import backend, background, cache, parallel_compile, units

    os.environ[background.ENV] = "0"  # everything before warmup returns, the compiled step included
    t0 = time.perf_counter()
    # models compile when named, or when nothing else is asked for (plain `warmup`: the default model)
    run_models = bool(models) or not (clear or import_path or all_kernels or export_path)
    if clear:
        from edgeinfer.models import layout_cache

        freed = cache.clear()
        click.echo(f"kernel cache cleared ({freed / 1e6:.1f} MB freed: {cache.root()})")
        freed = layout_cache.clear()
        click.echo(f"weight layouts cleared ({freed / 1e6:.1f} MB freed: {layout_cache.layouts_dir()})")
    if import_path:
        m = cache.import_cache(import_path)
        click.echo(f"imported {m['files']} files for tier {m['tier']} into {cache.folder()}")
    if all_kernels:
        c = parallel_compile.start(backend.KERNEL_PATH, units.FAMILY_OF, kv_types or KV_TYPES, experts=True,
                                       mixers=("shortconv", "deltanet", "mamba2"))
        if c is not None:
            c.wait()
    if run_models:
        from edgeinfer import LLM, SamplingParams

        for model in models or [registry.DEFAULT_MODEL]:
            for kv in kv_types or [""]:
                llm = LLM(model, kv_type=kv, progress=True)
                llm.generate([llm.tokenizer.bos_id or 0] * 2, SamplingParams(temperature=0, max_tokens=2,
                                                                             ignore_eos=True))
    if export_path:
        m = cache.export_cache(export_path)
        click.echo(f"exported tier {m['tier']} ({m['bytes'] / 1e6:.1f} MB) to {export_path}")
    if run_models or all_kernels:
        click.echo(f"kernels ready ({time.perf_counter() - t0:.1f} s; tier {cache.tier().name})")
