"""The one exception users see: a message that says what is wrong and what to do."""
from __future__ import annotations


class DmlgraphError(Exception):
    """A user-facing error. The CLI prints `str(err)` without a traceback and exits with `exit_code`."""

    exit_code = 2

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:
        base = super().__str__()
        return f"{base}\n  hint: {self.hint}" if self.hint else base


class ModelError(DmlgraphError):
    """The model file cannot be read or is not a valid ONNX model."""


class UnsupportedError(DmlgraphError):
    """A valid request this tool or DirectML cannot carry out."""


class InternalError(RuntimeError):
    """A bug in dmlgraph caught before it did harm (e.g. a model about to be written is invalid):
    the CLI reports it as an internal error (exit 3), not as the user's mistake."""
