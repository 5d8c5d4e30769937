"""Boolean combinations of a band with data: And/Or/Not/Cast/comparisons, each part bit-exact.

`And(P, band)` is P where the band is true and false elsewhere: one DIAGONAL_MATRIX1 with P (the
padding mask, broadcast) as its input, Value false, on the band's false region. `Or` is the dual
(Value true). `Not` and `Cast` (bool <-> numeric) of a band or of such a node map its Value and its
input (a new `Not`/`Cast` of the data), so a band reached through them still lowers. A comparison
of a band that holds data with a constant (LongT5's `mask > 0` of its int64 local mask, the locality
band And the padding) maps the same way.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from dmlgraph.ir.graph import OnnxNode, Value
from dmlgraph.passes.apply import Operand, Part, application_rule


def evaluate_logic(node: OnnxNode, operands: list[Operand], dtype: np.dtype) -> Part | str:
    """And/Or with one operand a constant: the identity gives the other operand, the absorbing
    element gives itself; two constants give their result."""
    a, b = operands
    op = node.op_type
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        f = {"And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor}[op]
        return Part(const=np.asarray(f(a, b), dtype))
    if isinstance(a, np.ndarray) and isinstance(b, Value):
        c, other = a, b
    elif isinstance(b, np.ndarray) and isinstance(a, Value):
        c, other = b, a
    else:
        return Part(op=(op, operands))
    absorbing = {"And": False, "Or": True}.get(op)
    if absorbing is not None and bool(c) == absorbing:
        return Part(const=np.asarray(absorbing, dtype))
    if op in ("And", "Or") or not bool(c):  # the identity (Xor with false, too)
        return Part(value=other)
    return Part(op=(op, operands))  # Xor with true: Not of the data, written as the Xor itself


def evaluate_not(node: OnnxNode, operands: list[Operand], dtype: np.dtype) -> Part | str:
    """Not of a constant, or of the data: the data's own Not's input where it is one (no Not(Not p))."""
    (a,) = operands
    if isinstance(a, np.ndarray):
        return Part(const=np.asarray(np.logical_not(a), dtype))
    p = a.producer
    if isinstance(p, OnnxNode) and p.op_type == "Not" and p.domain in ("", "ai.onnx") and p.inputs[0] is not None:
        return Part(value=p.inputs[0])
    return Part(op=("Not", operands))


def evaluate_cast(node: OnnxNode, operands: list[Operand], dtype: np.dtype) -> Part | str:
    """Cast between bool and a number only: both directions are exact on every value (a number
    casts to true unless it is +-0; NaN casts to true, as numpy and onnxruntime agree)."""
    (a,) = operands
    to = node.attr("to")
    if isinstance(a, np.ndarray):
        if a.dtype != np.bool_ and to != TensorProto.BOOL:
            return f"Cast {node.name!r} converts between two numeric types; only bool <-> numeric casts are mapped"
        return Part(const=np.asarray(a.astype(np.bool_) if dtype == np.bool_ else a, dtype))
    return Part(op=("Cast", operands))


COMPARE = {"Less": np.less, "LessOrEqual": np.less_equal, "Greater": np.greater,
           "GreaterOrEqual": np.greater_equal, "Equal": np.equal}


def evaluate_compare(node: OnnxNode, operands: list[Operand], dtype: np.dtype) -> Part | str:
    """A comparison of two constants is its result; with the data, the comparison of the data (the
    same op on the same values: bit-exact, NaN included)."""
    a, b = operands
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return Part(const=np.asarray(COMPARE[node.op_type](a, b), dtype))
    return Part(op=(node.op_type, operands))


MASK_BOOL = application_rule(
    "mask_bool", ("And", "Or", "Xor"), (0, 1), evaluate_logic, "bit-exact",
    "And(P, band) / Or(P, band), P any boolean data (the padding mask) -> DIAGONAL_MATRIX1(P broadcast, "
    "Value false / true)")
MASK_NOT = application_rule(
    "mask_not", ("Not",), (0,), evaluate_not, "bit-exact",
    "Not(band) -> the band with its values negated (a Not of its input, if it has one)")
MASK_CAST = application_rule(
    "mask_cast", ("Cast",), (0,), evaluate_cast, "bit-exact",
    "Cast(band) between bool and a number -> the band in the new type (a Cast of its input, if it has one)")
MASK_COMPARE = application_rule(
    "mask_compare", tuple(COMPARE), (0, 1), evaluate_compare, "bit-exact",
    "Greater(band, c) and the other comparisons with a constant -> the band of booleans (a comparison of its "
    "input, if it has one)", data_only=True)
