"""Additive and multiplicative masks: `Add(X, band)` with a 0 / lowest (or -inf) band, `Mul(X, 0/1 band)`.

Neither is bit-exact, so the rule states when it is equal and declines under `--exact`: `X + lowest`
is lowest exactly for |X| < 2^103 in float32 (`absorbing_bound`); float16 is declined. The proof of
that bound and what happens off the band: docs/internals.md, passes/apply_arith.py.
"""
from __future__ import annotations

import numpy as np

from dmlgraph.ir.graph import DmlNode, Graph, OnnxNode, Value, copied
from dmlgraph.passes.apply import (
    Operand,
    Part,
    Plan,
    aligned_bands,
    application_rule,
    off_region,
    uniform_constant,
)

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


def _folded(node: OnnxNode, operands: list[Operand], dtype: np.dtype) -> Part | str | None:
    """The op on two constants (a Part), a reason when a constant is not of the output's type, else
    None: what every evaluator here checks first."""
    if any(isinstance(o, np.ndarray) and o.dtype != dtype for o in operands):
        return f"{node.op_type} {node.name!r}: an operand's type is not the output's {dtype}"
    consts = [o for o in operands if isinstance(o, np.ndarray)]
    if len(consts) == len(operands):
        ufunc = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}[node.op_type]
        with np.errstate(all="ignore"):
            return Part(const=np.asarray(ufunc(*consts, dtype=dtype), dtype))
    return None


def evaluate_add(node: OnnxNode, operands: list[Operand], dtype: np.dtype) -> Part | str:
    folded = _folded(node, operands, dtype)
    if folded is not None:
        return folded
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
    folded = _folded(node, operands, dtype)
    if folded is not None:
        return folded
    c, x = _const_other(operands)
    if c is None:
        return Part(op=("Mul", operands))
    c = np.asarray(c, dtype)
    if c == 1:
        return Part(value=x)
    if c == 0 and not (dtype.kind == "f" and np.signbit(c)):
        return Part(const=np.zeros((), dtype), exact=dtype.kind != "f")
    return Part(op=("Mul", operands))


def evaluate_sub(node: OnnxNode, operands: list[Operand], dtype: np.dtype) -> Part | str:
    """`c - band` (GPT-1's `1 - b`): two constants on a generator's two regions, a fill of a
    constant X; `X - 0` is X (-0.0 - 0.0 is -0.0)."""
    folded = _folded(node, operands, dtype)
    if folded is not None:
        return folded
    a, b = operands
    if isinstance(b, np.ndarray) and isinstance(a, Value) and np.asarray(b, dtype) == 0 \
            and not (dtype.kind == "f" and np.signbit(np.asarray(b, dtype))):
        return Part(value=a)
    return Part(op=("Sub", operands))


def evaluate_arith(node: OnnxNode, operands: list[Operand], dtype: np.dtype) -> Part | str:
    return {"Add": evaluate_add, "Sub": evaluate_sub}.get(node.op_type, evaluate_mul)(node, operands, dtype)


def _absorbed(x: np.ndarray, fill: np.ndarray) -> bool:
    """Whether `x + fill` is `fill` (a lowest or -inf fill): the condition `EXACTNESS` states."""
    if np.isneginf(fill):
        return not (np.isnan(x) or np.isposinf(x))
    return bool(np.isfinite(x)) and abs(float(x)) < absorbing_bound(x.dtype)


_VIEWS = ("Identity", "Unsqueeze", "Squeeze", "Reshape", "Expand", "Slice", "Transpose", "Flatten")


def _held(graph: Graph, v: Value, depth: int = 0) -> list[np.ndarray]:
    """Constants `v` visibly holds somewhere (through views): a DIAGONAL_MATRIX1's Value and what
    its X holds, a Where's constant branches, a Mul's constant factor (its product wherever the other
    factor is 1, as in `(1 - padding) * finfo.min`)."""
    p = v.producer
    if depth > 8 or p is None:
        return []
    if isinstance(p, DmlNode):  # (its X, where not one constant, holds what it holds: a chain of bands)
        rest = off_region(graph, p)
        return [np.asarray(p.value)] + ([rest] if isinstance(rest, np.ndarray) else _held(graph, rest, depth + 1))
    if not isinstance(p, OnnxNode) or p.domain not in ("", "ai.onnx"):
        return []
    if p.op_type in _VIEWS and p.inputs[0] is not None:
        return _held(graph, p.inputs[0], depth + 1)
    if p.op_type in ("Where", "Mul"):
        found = [uniform_constant(graph, u) for u in p.inputs[1 if p.op_type == "Where" else 0:]]
        return [u for u in found if u is not None]
    return []


def unabsorbed(graph: Graph, plan: Plan) -> str | None:
    """Why a planned `Add` breaks the rule's stated condition for every input, else None: an operand
    folded with the band's lowest or -inf (not a band aligned with it, whose values are added as
    they are) visibly holds a value that fill does not absorb (transformers' causal + padding
    biases summed: finfo.min + finfo.min is -inf, not finfo.min)."""
    node, d = plan.node, plan.band
    if node.op_type != "Add":
        return None
    fills = [u for u in (np.asarray(d.value), off_region(graph, d)) if isinstance(u, np.ndarray)
             and u.dtype.kind == "f" and (np.isneginf(u) or u == np.finfo(u.dtype).min)]
    d_index = next(i for i, v in enumerate(node.inputs) if (u := copied(v)) is not None and u.producer is d)
    aligned = {j for j, _ in aligned_bands(graph, node, d_index, d)}
    for j, v in enumerate(node.inputs):
        if v is None or j == d_index or j in aligned:
            continue
        for held in _held(graph, v):
            for fill in fills:
                if not _absorbed(held.astype(fill.dtype), fill):
                    return (f"Add {node.name!r}: its operand {v.name!r} holds {held.item()!r}, to which adding "
                            f"{fill.item()!r} does not give {fill.item()!r} ({EXACTNESS})")
    return None


MASK_ARITH = application_rule(
    "mask_arith", ("Add", "Sub", "Mul"), (0, 1), evaluate_arith, EXACTNESS,
    "Add(X, 0/lowest or 0/-inf band), Mul(X, 0/1 band), c - band -> DIAGONAL_MATRIX1(X, Value lowest, -inf or 0)",
    output_is_mask=False, two_valued=True, check=unabsorbed)
