"""The one base class for errors a user can cause; the CLI prints these as one line, no traceback."""


class EdgeInferError(Exception):
    """Base of the runtime's user-facing errors (bad model names, failed pulls, bad requests)."""


class TokenizerError(EdgeInferError):
    """The GGUF vocabulary is missing, inconsistent or of an unsupported kind (edgeinfer.tokenizer's)."""
