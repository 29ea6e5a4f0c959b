"""Moved to edgeinfer.openai (protocol, responses). Kept only for cli/run.py's `edgeinfer embed`, which
imports embeddings_response from here and is not part of this change; remove once it imports
edgeinfer.openai.responses."""

from ..openai.responses import embeddings_response  # noqa: F401
