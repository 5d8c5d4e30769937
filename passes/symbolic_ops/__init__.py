"""ONNX operator semantics over the exact symbolic values of `dmlgraph.passes.symbolic`.

One function per op, registered in `HANDLERS` (rules as data) by the module of its family: each
takes the analysis, the node and its input values and returns its output values, or raises
`Unprovable` saying what it cannot show. `evaluate` runs a cone and names the node where a proof broke.
"""
from __future__ import annotations

# importing the families registers their handlers
from dmlgraph.passes.symbolic_ops import arith, casts, grids, layout, logic, shapes  # noqa: F401
from dmlgraph.passes.symbolic_ops.casts import cast
from dmlgraph.passes.symbolic_ops.core import (
    ELEMENTWISE,
    HANDLERS,
    SLICE_TO_END,
    Handler,
    evaluate,
    handles,
    stored_value,
)
from dmlgraph.passes.symbolic_ops.layout import slice_value

__all__ = ["ELEMENTWISE", "HANDLERS", "SLICE_TO_END", "Handler", "cast", "evaluate", "handles", "slice_value",
           "stored_value"]
