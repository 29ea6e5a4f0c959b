"""`edgeinfer system`: the CPU, its ISA features, the kernel path and the threading."""

from __future__ import annotations

import json

import click


@click.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of a table.")
def system(as_json):
    """The CPU, its ISA features, the kernel path, threads and Numba's threading layer."""
    from edgeinfer.system import format_system, system_info

    info = system_info()
    click.echo(json.dumps(info) if as_json else format_system(info))
