"""Kept only for cli/batch.py, which imports engine_options from here: the commands this module held are
one file each now, and the options they share are in common.py."""

from .common import engine_options  # noqa: F401
