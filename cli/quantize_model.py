"""`edgeinfer quantize-model` (or `quantize`): quantize a GGUF model file into another."""

from __future__ import annotations

import click
import numpy as np


@click.command("quantize-model")
@click.argument("src", type=click.Path(exists=True, dir_okay=False))
@click.argument("dst", type=click.Path(dir_okay=False))
@click.option("--type", "type_name", required=True,
              help="F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q3_K Q4_K Q5_K Q6_K, or the mixes Q2_K Q3_K_S "
                   "Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M IQ4_NL IQ4_XS.")
@click.option("--imatrix", "imatrix_path", type=click.Path(dir_okay=False), default=None,
              help="An importance matrix (edgeinfer imatrix or llama-imatrix: GGUF or .dat) for the types that use one.")
@click.option("--output-type", default=None, help="Type for output.weight (a tensor type, e.g. Q8_0).")
@click.option("--token-embedding-type", default=None, help="Type for token_embd.weight.")
@click.option("--pure", is_flag=True, help="Every quantizable tensor gets --type: no per-tensor mix rules.")
@click.option("--threads", type=click.IntRange(0, None), default=0, help="Threads (default: all cores).")
@click.option("--dry-run", is_flag=True, help="Print the per-tensor plan and the estimated size; write nothing.")
@click.option("--force", is_flag=True, help="Overwrite DST if it exists.")
def quantize_model_cmd(src, dst, type_name, imatrix_path, output_type, token_embedding_type, pure, threads, dry_run,
                       force):
    """Quantize the GGUF model SRC into DST (llama.cpp's per-tensor rules for the mixes)."""
    from edgeinfer.gguf_file import GGUFFile
    from edgeinfer.quant import mixes, tool

    type_name = type_name.upper()
    if type_name not in mixes.TYPES:
        raise click.ClickException(f"unknown type {type_name!r} (choose from {', '.join(mixes.TYPES)})")
    out_t = mixes.parse_type(output_type, mixes.TENSOR_TYPES) if output_type else None
    emb_t = mixes.parse_type(token_embedding_type, mixes.TENSOR_TYPES) if token_embedding_type else None
    with GGUFFile(src) as gf:
        imatrix = _load_imatrix(imatrix_path, gf) if imatrix_path else None
        if dry_run:
            p = tool.make_plan(gf, type_name, pure=pure, output_type=out_t, token_embedding_type=emb_t,
                               has_imatrix=imatrix is not None)
            width = max(len(x.name) for x in p)
            for x in p:
                click.echo(f"{x.name:<{width}}  {'x'.join(map(str, x.shape)):>14}  {x.src_type.name:>5} -> "
                           f"{x.dst_type.name:<5} {x.note}")
            est = tool.estimate(p)
            n = sum(int(np.prod(x.shape)) for x in p)
            click.echo(f"estimated tensor data: {est / 1e6:.1f} MB ({8 * est / n:.2f} bits per weight); "
                       f"source file {gf.file_size / 1e6:.1f} MB")
            return
        s = tool.quantize_model(gf, dst, type_name, pure=pure, output_type=out_t, token_embedding_type=emb_t,
                                threads=threads, force=force, imatrix=imatrix,
                                warn=lambda m: click.echo(f"warning: {m}", err=True))
    counts = {}
    for x in s.plan:
        counts[x.dst_type.name] = counts.get(x.dst_type.name, 0) + 1
    click.echo(f"{src} ({s.src_bytes / 1e6:.1f} MB) -> {dst} ({s.dst_bytes / 1e6:.1f} MB), "
               f"{s.bits_per_weight:.2f} bits per weight, {s.seconds:.1f} s; tensors: "
               + " ".join(f"{k}:{v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])))


def _load_imatrix(path, gf):
    """The importance matrix at path, checked against the model's tensors: a one-line error otherwise."""
    from edgeinfer.quant.imatrix import Imatrix

    try:
        m = Imatrix.load(path)
        m.check(gf)
    except (OSError, ValueError) as e:  # one line, as the command's other errors ("error: ...")
        msg = str(e)
        raise ValueError(msg if str(path) in msg else f"imatrix {path}: {msg}") from None
    return m
