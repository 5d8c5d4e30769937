"""New standard nodes written in the model's own opset.

Rules build today's forms (Shape with start/end, opset 15; Unsqueeze/Squeeze axes as an input,
opset 13); a model of an older opset gets their older equivalents, so the written model passes
onnx's checker and loads in onnxruntime as its input did. The rewriter calls `legalize`.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from dmlgraph.ir.graph import Node, OnnxNode, Value

INT64_MAX = np.iinfo(np.int64).max
SHAPE_BOUNDS = 15  # Shape's start/end attributes
AXES_INPUT = 13  # Unsqueeze/Squeeze axes as their second input


def default_opset(opsets: dict[str, int]) -> int:
    return opsets.get("", opsets.get("ai.onnx", 0))


def legalize(nodes: list[Node], initializers: list[Value], opset: int) -> str | None:
    """Rewrite `nodes` (a replacement's, new and detached) in place into forms `opset` has, adding
    the constants they need to `initializers`; the reason when one has no such form."""
    if opset >= SHAPE_BOUNDS:
        return None
    out: list[Node] = []
    for n in nodes:
        if not isinstance(n, OnnxNode) or n.domain not in ("", "ai.onnx"):
            out.append(n)
        elif n.op_type == "Shape" and any(a.name in ("start", "end") for a in n.attributes):
            out += _shape_then_slice(n, initializers)
        elif n.op_type in ("Unsqueeze", "Squeeze") and opset < AXES_INPUT and len(n.inputs) > 1:
            axes = n.inputs[1]
            arr = None if axes is None else axes.array if axes.array is not None else \
                None if axes.initializer is None else numpy_helper.to_array(axes.initializer)
            if arr is None:
                return f"{n.op_type} {n.name!r} takes computed axes, which opset {opset} cannot"
            n.inputs = n.inputs[:1]
            n.attributes = [a for a in n.attributes if a.name != "axes"] + \
                [helper.make_attribute("axes", [int(x) for x in np.asarray(arr).reshape(-1)])]
            out.append(n)
        else:
            out.append(n)
    nodes[:] = out
    read = {id(v) for n in out for v in n.inputs if v is not None}
    initializers[:] = [v for v in initializers if id(v) in read]  # (an axes constant now an attribute)
    return None


def _shape_then_slice(n: OnnxNode, initializers: list[Value]) -> list[Node]:
    """Shape(x, start, end) as Shape(x) then Slice(start, end) (onnx's own definition of the bounds)."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attributes}
    x, out = n.inputs[0], n.outputs[0]
    rank = None if x is None or x.shape is None else len(x.shape)
    whole = Value(f"{out.name}__whole", TensorProto.INT64, None if rank is None else (rank,))
    bounds = []
    for name, v in (("start", attrs.get("start", 0)), ("end", attrs.get("end", INT64_MAX))):
        c = Value(f"{out.name}__{name}")
        c.array = np.array([v], np.int64)
        c.elem_type, c.shape = TensorProto.INT64, (1,)
        initializers.append(c)
        bounds.append(c)
    shape = OnnxNode("", "Shape", [x], [whole])
    return [shape, OnnxNode(n.name, "Slice", [whole, *bounds], [out])]
