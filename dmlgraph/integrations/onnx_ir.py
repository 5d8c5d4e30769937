"""dmlgraph's lowering as an onnx-ir pass (`pip install dmlgraph[onnx-ir]`).

A functional pass over an `onnx_ir.Model` (e.g. `torch.onnx.export(..., dynamo=True).model`): the
same pipeline `dmlgraph optimize` runs, without writing a file; the kept initializers are the input
model's own tensor objects (no copy of the weights). Usage: docs/internals.md, integrations/onnx_ir.py.
"""
from __future__ import annotations

import onnx
import onnx_ir as ir

from dmlgraph import pipeline
from dmlgraph.errors import DmlgraphError
from dmlgraph.ir.ops import FeatureLevel


class LowerToDiagonalMatrix(ir.passes.FunctionalPass):
    """Lower every diagonal-structured computation (EyeLike, Trilu, causal/band masks) onto
    DIAGONAL_MATRIX1.

    target: "dml" writes com.dmlgraph DiagonalMatrix1 nodes (DirectML); "onnx" writes standard ops
    only (any runtime). exact: keep only bit-exact rewrites. feature_level: the DML feature level
    the lowered nodes must run at ("5_1"; below it EyeLike becomes DIAGONAL_MATRIX).
    `PassResult.modified` says whether the graph changed.
    """

    def __init__(self, target: str = "dml", exact: bool = False,
                 feature_level: str | FeatureLevel = "5_1", allow_growth: bool = False) -> None:
        self.target = pipeline.check_target(target)
        self.options = pipeline.make_options(exact=exact, feature_level=feature_level, allow_growth=allow_growth)
        self.counts: dict[str, int] = {}  # rewrites per rule in the last call

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        proto = ir.serde.serialize_model(model)
        result = pipeline.lower(proto, self.options, self.target, base_dir=_base_dir(model))
        lowered = result.model
        out = ir.serde.deserialize_model(lowered)
        _reuse_tensors(model, out)
        self.counts = dict(result.counts)
        # A portable model lowers again to the same nodes: that is no change (a PassManager stops).
        modified = bool(result.rewrites) and _nodes(lowered) != _nodes(proto)
        return ir.passes.PassResult(out, modified=modified)


def _nodes(model: onnx.ModelProto) -> tuple[list[bytes], list[str]]:
    """The main graph's nodes (bytes) and initializer names: equal when a pass changed nothing."""
    return [n.SerializeToString(deterministic=True) for n in model.graph.node], \
        [t.name for t in model.graph.initializer]


def _base_dir(model: ir.Model) -> str | None:
    """The folder external initializers are stored relative to (one folder; None if none)."""
    dirs = {str(v.const_value.base_dir) for v in model.graph.initializers.values()
            if isinstance(v.const_value, ir.ExternalTensor)}
    if len(dirs) > 1:
        raise DmlgraphError(f"the model's external data lives in {len(dirs)} folders ({', '.join(sorted(dirs))})",
                            hint="save the model with its external data in one folder first")
    return dirs.pop() if dirs else None


def _reuse_tensors(src: ir.Model, dst: ir.Model) -> None:
    """Give `dst` the tensor objects of `src` for initializers that kept their name, type and shape."""
    for name, v in dst.graph.initializers.items():
        old = src.graph.initializers.get(name)
        if old is None or old.const_value is None or v.const_value is None:
            continue
        if old.const_value.dtype == v.const_value.dtype and old.const_value.shape == v.const_value.shape:
            v.const_value = old.const_value
