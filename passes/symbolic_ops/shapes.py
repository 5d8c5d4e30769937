"""Shape, Size, Constant, ConstantOfShape and Identity: where sizes and stored values enter a cone."""
from __future__ import annotations

import numpy as np
import onnx

from dmlgraph.ir.graph import OnnxNode
from dmlgraph.passes.symbolic import INT64, Analysis, Band, Elems, Lin, Unprovable, as_lin, shape_of
from dmlgraph.passes.symbolic_ops.core import attr, dims_from, handles, stored_value


@handles("Shape")
def _shape(an: Analysis, n: OnnxNode, ins: list) -> list:
    dims = shape_of(ins[0])
    r = len(dims)
    start, end = int(attr(n, "start", 0)), attr(n, "end")
    start = min(max(start + r if start < 0 else start, 0), r)
    stop = r if end is None else min(max(int(end) + r if int(end) < 0 else int(end), 0), r)
    picked = dims[start:stop]
    return [Elems(INT64, (len(picked),), tuple(picked))]


@handles("Size")
def _size(an: Analysis, n: OnnxNode, ins: list) -> list:
    total, symbolic = 1, None
    for d in shape_of(ins[0]):
        lin = as_lin(d, "a size")
        if lin.is_const:
            total *= lin.const
        elif symbolic is None:
            symbolic = lin
        else:
            raise Unprovable("the product of two sizes is not affine")
    value = Lin.of(total) if symbolic is None else symbolic.scale(total)
    return [Elems(INT64, (), (value,))]


@handles("Constant")
def _constant(an: Analysis, n: OnnxNode, ins: list) -> list:
    sv = stored_value
    for a in n.attributes:
        if a.name == "value":
            return [sv(an, onnx.numpy_helper.to_array(a.t))]
        if a.name in ("value_int", "value_ints"):
            return [sv(an, np.array(onnx.helper.get_attribute_value(a), np.int64))]
        if a.name in ("value_float", "value_floats"):
            return [sv(an, np.array(onnx.helper.get_attribute_value(a), np.float32))]
    raise Unprovable("a Constant of a kind the analysis does not read")


@handles("ConstantOfShape")
def _constant_of_shape(an: Analysis, n: OnnxNode, ins: list) -> list:
    dims = dims_from(an, ins[0], "the shape")
    t = attr(n, "value")
    arr = np.zeros(1, np.float32) if t is None else onnx.numpy_helper.to_array(t)
    return [Band(arr.dtype, dims, (), (arr.reshape(-1)[0],))]


@handles("Identity")
def _identity(an: Analysis, n: OnnxNode, ins: list) -> list:
    return [ins[0]]
