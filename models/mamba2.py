"""The `mamba2` architecture (Mamba-2, state-spaces/mamba2-*): every layer an RMS norm, a Mamba2 mixer
(models/parts/mamba2.py: a recurrent state per sequence, no KV) and the residual; no feed-forward, no
attention, no positions."""

from .decoder import ArchSpec

SPEC = ArchSpec("mamba2", recurrent="mamba2", feed_forward=False)
