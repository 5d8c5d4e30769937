"""EyeLike(x, k, dtype) -> DIAGONAL_MATRIX1(no input, Value 1, Begin k, End k + 1): bit-exact.

Below feature level 5_1 it becomes DIAGONAL_MATRIX(Offset k, Value 1.0) where that level supports
the type and rank (a 2-D matrix is padded to 4 dims when the level needs 4: a free reshape).
The output shape is x's: static sizes when known, else a Shape node feeds the DML node.
"""
from __future__ import annotations

from onnx import TensorProto

from dmlgraph.ir.dtypes import INT32_MAX, INT32_MIN
from dmlgraph.ir.graph import DmlNode, Node, OnnxNode
from dmlgraph.ir.ops import FeatureLevel
from dmlgraph.passes.common import lowering_reason, one_of, replace_node, standin
from dmlgraph.rewrite import Context, Match, Replacement, Rule, detached

_TENSOR_TYPES = frozenset(v for _, v in TensorProto.DataType.items()) - {TensorProto.UNDEFINED}


def _match(ctx: Context, node: Node) -> Match | None:
    options = ctx.options
    if not isinstance(node, OnnxNode) or node.domain not in ("", "ai.onnx"):
        return None
    x = node.input(0)
    m = Match("eyelike", [node])
    if x is None:
        m.reason = "it has no input"
        return m
    elem_type = node.attr("dtype") or x.elem_type
    if elem_type is None:
        m.reason = "the output type is unknown"
        return m
    if elem_type not in _TENSOR_TYPES:
        m.reason = f"dtype {elem_type} is not an ONNX tensor type"
        return m
    # Any diagonal beyond +-(2^31 - 2) lies outside every matrix DML can hold, so the clamp is exact.
    k = min(max(int(node.attr("k", 0)), INT32_MIN + 1), INT32_MAX - 2)
    kind = "DiagonalMatrix1" if options.feature_level >= FeatureLevel.L5_1 else "DiagonalMatrix"
    static = x.static_shape
    shape = None
    if static is None:  # the sizes are x's, read at run time
        shape = detached(f"{x.name}__shape", TensorProto.INT64, (len(x.shape),) if x.shape is not None else None)
        # (An unnamed EyeLike's Shape is left unnamed: the engine names it by its output, unique in
        # its scope; "Shape_" twice in a body or function made onnxruntime refuse the model.)
        m.captures["shape_node"] = OnnxNode(f"Shape_{node.name}" if node.name else "", "Shape", [x], [shape])
    dml = DmlNode(node.name, None, shape, None, standin(node.outputs[0], elem_type), elem_type=elem_type,
                  value=one_of(elem_type), begin=k, end=k + 1, static_shape=static, kind=kind)
    m.reason = lowering_reason(dml, x.shape, options)
    if m.reason and kind == "DiagonalMatrix":
        m.reason += " (DIAGONAL_MATRIX1 would need feature level 5_1)"
    m.dml = dml
    return m


def _rewrite(ctx: Context, m: Match) -> Replacement:
    shape_node = m.captures.get("shape_node")
    return replace_node(m.nodes[0], m.dml, *([shape_node] if shape_node else []))


RULE = Rule("eyelike", ("EyeLike",), _match, _rewrite, exact="bit-exact",
            description="EyeLike(x, k) -> DIAGONAL_MATRIX1(Value 1, Begin k, End k+1)")
