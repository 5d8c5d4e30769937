"""Additive and multiplicative masks: `Add(X, band)` with a 0 / lowest (or -inf) band, `Mul(X, 0/1 band)`.

Neither is bit-exact, so the rule states when it is equal and declines under `--exact`. The band
must be two-valued (a generator): a mask that also carries the padding is computed once and read by
every layer's Add, which stays (moving the Add into one DIAGONAL_MATRIX1 per layer would cost more).

`X + lowest == lowest` (round to nearest, ties to even). The spacing of floats at lowest's binade is
u = 2^(emax - p + 1) (2^104 in float32, 2^971 in float64, 32 in float16). For |X| < u / 2 the exact sum
is nearer to lowest than to either neighbour, so it rounds to lowest. At X = +u/2 it is a tie
between lowest (odd mantissa: all ones) and lowest + u (even), which wins; at X = -u/2 the tie is
with 2^(emax+1), which rounds to -inf. So the condition is exactly |X| < u / 2 for finite X:
float32 |X| < 2^103, float64 |X| < 2^970 (`absorbing_bound`; tests/test_apply.py checks every float16
and the float32 bit patterns around the bound). float16 gives |X| < 16, which attention scores pass
routinely: declined. `X + -inf == -inf` for every X but +inf and NaN.

Off the band the data passes through: `X + 0.0` is X except that -0.0 becomes +0.0 (a fill of -0.0 is
exact), `X * 1` is X. `X * 0` is 0 for finite X (its sign follows X's; inf and NaN give NaN).
"""
from __future__ import annotations

import numpy as np

from dmlgraph.ir.graph import OnnxNode, Value
from dmlgraph.passes.apply import Operand, Part, application_rule

EXACTNESS = ("equal where the data X is finite and, under a lowest-float fill, |X| < 2^103 (float32) "
             "or 2^970 (float64); signed zeros may differ")


def absorbing_bound(dtype: np.dtype) -> float:
    """The B with `X + lowest == lowest` exactly when |X| < B (finite X): half the spacing of floats
    at lowest's binade."""
    info = np.finfo(dtype)
    top_spacing = float(info.max) - float(np.nextafter(info.max, info.dtype.type(0)))
    return top_spacing / 2


def _const_other(operands: list[Operand]) -> tuple[np.ndarray, Value] | tuple[None, None]:
    """(the constant, the other) of two operands when exactly one is a constant."""
    a, b = operands
    if isinstance(a, np.ndarray) and isinstance(b, Value):
        return a, b
    if isinstance(b, np.ndarray) and isinstance(a, Value):
        return b, a
    return None, None


def evaluate_add(node: OnnxNode, operands: list[Operand], dtype: np.dtype) -> Part | str:
    if any(isinstance(o, np.ndarray) and o.dtype != dtype for o in operands):
        return f"Add {node.name!r}: an operand's type is not the output's {dtype}"
    consts = [o for o in operands if isinstance(o, np.ndarray)]
    if len(consts) == len(operands):
        with np.errstate(all="ignore"):
            return Part(const=np.asarray(np.add(*consts, dtype=dtype), dtype))
    c, x = _const_other(operands)
    if c is None:
        return Part(op=("Add", operands))
    c = np.asarray(c, dtype)
    if dtype.kind == "f":
        if c == 0:
            return Part(value=x, exact=bool(np.signbit(c)))  # X + -0.0 is X; X + 0.0 turns -0.0 into +0.0
        if np.isneginf(c):
            return Part(const=c, exact=False)
        if c == np.finfo(dtype).min:
            if dtype.itemsize < 4:
                return (f"Add {node.name!r}: in {dtype} X + lowest is lowest only for |X| < "
                        f"{absorbing_bound(dtype):g}, which attention scores exceed; not lowered")
            return Part(const=c, exact=False)
    elif c == 0:
        return Part(value=x)
    return Part(op=("Add", operands))


def evaluate_mul(node: OnnxNode, operands: list[Operand], dtype: np.dtype) -> Part | str:
    if any(isinstance(o, np.ndarray) and o.dtype != dtype for o in operands):
        return f"Mul {node.name!r}: an operand's type is not the output's {dtype}"
    consts = [o for o in operands if isinstance(o, np.ndarray)]
    if len(consts) == len(operands):
        with np.errstate(all="ignore"):
            return Part(const=np.asarray(np.multiply(*consts, dtype=dtype), dtype))
    c, x = _const_other(operands)
    if c is None:
        return Part(op=("Mul", operands))
    c = np.asarray(c, dtype)
    if c == 1:
        return Part(value=x)
    if c == 0 and not (dtype.kind == "f" and np.signbit(c)):
        return Part(const=np.zeros((), dtype), exact=dtype.kind != "f")
    return Part(op=("Mul", operands))


def evaluate_arith(node: OnnxNode, operands: list[Operand], dtype: np.dtype) -> Part | str:
    return (evaluate_add if node.op_type == "Add" else evaluate_mul)(node, operands, dtype)


MASK_ARITH = application_rule(
    "mask_arith", ("Add", "Mul"), (0, 1), evaluate_arith, EXACTNESS,
    "Add(X, 0/lowest or 0/-inf band), Mul(X, 0/1 band) -> DIAGONAL_MATRIX1(X, Value lowest, -inf or 0)",
    output_is_mask=False, two_valued=True)
