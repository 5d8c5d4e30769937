"""dmlgraph's lowering as an onnx-ir pass (`pip install dmlgraph[onnx-ir]`).

`torch.onnx.export(..., dynamo=True)` returns an `ONNXProgram` whose `.model` is an `onnx_ir.Model`;
this pass lowers it without writing a file::

    onnx_program = torch.onnx.export(model, args, dynamo=True)
    result = LowerToDiagonalMatrix()(onnx_program.model)
    onnx_program.model = result.model

It is a functional pass (the input model is left as it was; a new model is returned), so it can
sit in an `onnx_ir.passes.PassManager` beside onnx-ir's own passes. The model goes through a
ModelProto once each way (`onnx_ir.serde`), the same pipeline `dmlgraph optimize` runs, and back;
initializers the lowering kept are handed back as the input model's own tensor objects, so the
weights are not copied into the result (the ModelProto holds one copy while the pass runs).
"""
from __future__ import annotations

import onnx
import onnx_ir as ir

from dmlgraph.errors import DmlgraphError
from dmlgraph.io.cleanup import cleanup
from dmlgraph.io.modelfile import without_weights
from dmlgraph.io.onnx_io import export_model, import_model
from dmlgraph.ir.ops import FeatureLevel
from dmlgraph.pipeline import growth, optimize_graph
from dmlgraph.rewrite import Options

TARGETS = ("dml", "onnx")


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
        if target not in TARGETS:
            raise ValueError(f"target must be one of {', '.join(TARGETS)}, not {target!r}")
        self.target = target
        self.options = Options(feature_level=FeatureLevel.parse(feature_level), exact_only=exact,
                               allow_growth=allow_growth)
        self.counts: dict[str, int] = {}  # rewrites per rule in the last call

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        proto = ir.serde.serialize_model(model)
        g = import_model(proto, _base_dir(model))
        result = optimize_graph(g, self.options)
        g.remove_dead()
        lowered = export_model(g, self.target)
        cleanup(lowered)  # (as `optimize` does: what a portable form leaves unread goes, repeats merge)
        if not self.options.allow_growth and growth(proto, lowered) is not None:
            self.counts = {k: 0 for k in result.counts}  # nothing grows (as `optimize`): the model as it was
            out = ir.serde.deserialize_model(proto)  # (a functional pass returns a new model)
            _reuse_tensors(model, out)
            return ir.passes.PassResult(out, modified=False)
        onnx.checker.check_model(without_weights(lowered, keep_dims=False, has_external=True), full_check=False)
        out = ir.serde.deserialize_model(lowered)
        _reuse_tensors(model, out)
        self.counts = dict(result.counts)
        # A portable model lowers again to the same nodes: that is no change (a PassManager stops).
        modified = bool(result.applied) and _nodes(lowered) != _nodes(proto)
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
