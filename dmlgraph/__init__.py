"""dmlgraph: lower diagonal-structured ONNX computations onto DirectML's DIAGONAL_MATRIX1.

    import dmlgraph
    result = dmlgraph.optimize("model.onnx")          # or an onnx.ModelProto (never modified)
    result.save("lowered.onnx")                       # atomic, onnx-checked
    dmlgraph.validate("model.onnx", result).ok        # run both, compare every rewritten tensor

The names below load on first use, so `import dmlgraph` stays cheap for the command line.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["Decline", "DmlgraphError", "Inspection", "ModelError", "OptimizeResult", "Rewrite", "TensorCheck",
           "UnsupportedError", "ValidationResult", "__version__", "inspect", "optimize", "process_wide", "run",
           "validate"]

if TYPE_CHECKING:
    from dmlgraph.api import (
        Decline,
        Inspection,
        OptimizeResult,
        Rewrite,
        TensorCheck,
        ValidationResult,
        inspect,
        optimize,
        run,
        validate,
    )
    from dmlgraph.errors import DmlgraphError, ModelError, UnsupportedError
    from dmlgraph.process import process_wide

_HOMES = {"DmlgraphError": "dmlgraph.errors", "ModelError": "dmlgraph.errors", "UnsupportedError": "dmlgraph.errors",
          "process_wide": "dmlgraph.process"}


def __getattr__(name: str) -> Any:
    """Load the public names lazily (PEP 562): the API pulls in onnxruntime, `--version` should not."""
    if name not in __all__:
        raise AttributeError(f"module 'dmlgraph' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(_HOMES.get(name, "dmlgraph.api")), name)
    globals()[name] = value
    return value
