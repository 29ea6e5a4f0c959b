"""The registry's errors: each message is one line, which the CLI prints as it is."""

from ..errors import EdgeInferError


class ModelNotFoundError(EdgeInferError):
    """An unknown model name or a missing file."""


class InvalidNameError(ModelNotFoundError):
    """A model name that could reach outside the cache (a path, '..', a leading dot)."""


class PullError(EdgeInferError):
    """A pull failed: network, registry, checksum or disk."""
