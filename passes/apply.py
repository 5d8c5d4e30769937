"""Masks applied to data become one DIAGONAL_MATRIX1 with that data as its input.

A generator G (a DmlNode with no input, or a scalar constant input) is `value` on a diagonal
region R and `other` elsewhere. Then, with X the data:
  Where(G, X, c) / Where(G, c, X)  -> DIAGONAL_MATRIX1(X, Value c, R or its complement)  bit-exact
  Mul(X, G) with G in {0, 1}       -> DIAGONAL_MATRIX1(X, Value 0, where G is 0)         equal for finite X
  Add(X, G) with G in {0, -inf}    -> DIAGONAL_MATRIX1(X, Value -inf, where G is -inf)    equal for finite X
and a DIAGONAL_MATRIX1 whose input is another one with the same value and k fuses into one node
whose region is the union (tril(triu(x, a), b) is one inverted-range node), when the union is one
(possibly inverted) interval.
"""
from __future__ import annotations

import math
import re

import numpy as np

from dmlgraph.dtypes import bitwise_equal
from dmlgraph.graph import DmlNode, Graph, Node, Value
from dmlgraph.rewrite import Match, Options, Rule
from passes.common import const_value, lowering_reason, replace_node

INF = math.inf


# ---- regions: sets of diagonals as (begin, end) with None = unbounded --------------------------
def _pieces(begin, end) -> list[tuple[float, float]]:
    lo, hi = (-INF if begin is None else begin), (INF if end is None else end)
    if begin is not None and end is not None and begin > end:
        return [(-INF, end), (begin, INF)]  # inverted: outside [end, begin)
    return [(lo, hi)] if lo < hi else []


def _from_pieces(pieces) -> tuple[int | None, int | None] | None:
    merged: list[list[float]] = []
    for lo, hi in sorted(p for p in pieces if p[0] < p[1]):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    def b(x):
        return None if math.isinf(x) else int(x)
    if not merged:
        return 0, 0  # the empty region
    if len(merged) == 1:
        return b(merged[0][0]), b(merged[0][1])
    if len(merged) == 2 and merged[0][0] == -INF and merged[1][1] == INF:
        return int(merged[1][0]), int(merged[0][1])  # inverted
    return None


def union(r1, r2):
    return _from_pieces(_pieces(*r1) + _pieces(*r2))


def complement(r):
    cuts = [-INF]
    for lo, hi in _pieces(*r):
        cuts += [lo, hi]
    cuts.append(INF)
    return _from_pieces([(cuts[i], cuts[i + 1]) for i in range(0, len(cuts), 2)])


# ---- generators ----------------------------------------------------------------------------------
def generator_values(graph: Graph, v: Value | None):
    """(node, value, other) when `v` is made by a generator: no input, or a scalar constant one."""
    n = v.producer if v is not None else None
    if not isinstance(n, DmlNode) or n.kind != "DiagonalMatrix1":
        return None
    x = n.inputs[0]
    if x is None:
        return n, np.asarray(n.value), np.zeros((), np.asarray(n.value).dtype)
    arr = const_value(graph, x) if x.name in graph.initializers else None
    if arr is None or arr.size != 1:
        return None
    return n, np.asarray(n.value), np.asarray(arr).reshape(())


def _scalar(graph: Graph, v: Value):
    """A one-element constant, keeping its rank (a [1, 1, 1] constant still broadcasts)."""
    arr = const_value(graph, v)
    return None if arr is None or arr.size != 1 else np.asarray(arr)


def _same_size(m, x) -> bool:
    """Mask dim m is data dim x wherever the model runs: equal, or `min(x, c)` (a slice of a stored
    c x c mask), which broadcasts with x only where it equals x (x <= c, or x == 1 where both are 1)."""
    return m is not None and (m == x or (isinstance(m, str) and isinstance(x, str) and
                                         re.fullmatch(rf"min\({re.escape(x)}, \d+\)", m) is not None))


def _covers(mask_shape, x_shape) -> bool:
    """The mask's matrix is X's matrix (the last two dims equal: a [1, W] mask is not a band of an
    [H, W] X) and its batch dims broadcast into X's without growing them."""
    if mask_shape is None or x_shape is None or len(mask_shape) < 2 or len(mask_shape) > len(x_shape):
        return False
    if not all(_same_size(m, x) for m, x in zip(mask_shape[-2:], x_shape[-2:])):
        return False
    return all(m == 1 or (m is not None and m == x) for m, x in zip(reversed(mask_shape[:-2]), reversed(x_shape[:-2])))


def _apply(graph, node, gen, x, value, region, exact: bool, rule: str, options: Options) -> Match:
    m = Match(rule, [node])
    if x.elem_type != node.outputs[0].elem_type and node.outputs[0].elem_type is not None:
        m.reason = "the mask's value type differs from the data's"
        return m
    if not _covers(gen.outputs[0].shape, x.shape) or np.ndim(value) > len(x.shape):
        m.reason = "cannot prove the result has the data's shape (the mask or the constant may broadcast it)"
        return m
    if region is None:
        m.reason = "the region is not one diagonal interval"
        return m
    dt = np.asarray(value).dtype
    value = np.asarray(value).reshape(())
    dml = DmlNode(node.name or graph.fresh_name(rule), x, None, gen.inputs[2], node.outputs[0], elem_type=x.elem_type,
                  value=dt.type(value), begin=region[0], end=region[1], exact=exact)
    m.captures["dml"] = dml
    m.reason = lowering_reason(dml, x.shape, options)
    return m


def _match_where(graph: Graph, node: Node, options: Options) -> Match | None:
    cond, a, b = node.input(0), node.input(1), node.input(2)
    g = generator_values(graph, cond)
    if g is None:
        return None
    gen, value, other = g
    true_region = (gen.begin, gen.end) if bool(value) else complement((gen.begin, gen.end))
    if bool(value) == bool(other):
        return None  # a constant condition; nothing diagonal about it
    ca, cb = _scalar(graph, a), _scalar(graph, b)
    if ca is not None and cb is None:       # c where cond, X elsewhere
        return _apply(graph, node, gen, b, ca, true_region, True, "mask_where", options)
    if cb is not None and ca is None:       # X where cond, c elsewhere
        return _apply(graph, node, gen, a, cb, complement(true_region), True, "mask_where", options)
    return None


def _match_arith(graph: Graph, node: Node, options: Options) -> Match | None:
    for gi in (0, 1):
        g = generator_values(graph, node.input(gi))
        if g is None:
            continue
        gen, value, other = g
        x = node.input(1 - gi)
        if x is None or _scalar(graph, x) is not None or value.dtype.kind != "f":
            return None
        region = (gen.begin, gen.end)
        # Which part is the identity (1 for Mul, 0 for Add) and which the absorbing fill.
        ident = 1 if node.op_type == "Mul" else 0
        if value == ident and other != ident:
            fill, fill_region = other, complement(region)
        elif other == ident and value != ident:
            fill, fill_region = value, region
        else:
            return None
        if node.op_type == "Mul" and fill != 0:
            return None
        if node.op_type == "Add" and not np.isneginf(fill):
            # X + c is c only for c = -inf (finite X). Not for -10000, nor for the lowest finite
            # value (float16: 65504 + 20 rounds to -65472), so such masks stay generators.
            return None
        if options.exact_only:
            m = Match("mask_arith", [node], reason="not bit-exact (equal for finite inputs); --exact is on")
            return m
        return _apply(graph, node, gen, x, np.asarray(fill, value.dtype), fill_region, False, "mask_arith", options)
    return None


def _rewrite_apply(graph: Graph, m: Match, options: Options) -> list[Node]:
    return [replace_node(graph, m.nodes[0], m.captures["dml"])]


def _match_chain(graph: Graph, node: Node, options: Options) -> Match | None:
    if not isinstance(node, DmlNode) or node.kind != "DiagonalMatrix1":
        return None
    inner = node.inputs[0].producer if node.inputs[0] is not None else None
    if not isinstance(inner, DmlNode) or inner.kind != "DiagonalMatrix1" or inner.inputs[0] is None:
        return None
    if len(inner.outputs[0].uses) != 1 or graph.is_graph_output(inner.outputs[0]):
        return None
    if node.inputs[1] is not None or node.static_shape is not None or inner.inputs[1] is not None \
            or inner.static_shape is not None or inner.inputs[2] is not node.inputs[2]:
        return None
    if not bitwise_equal(np.asarray(node.value), np.asarray(inner.value)):
        return None
    region = union((inner.begin, inner.end), (node.begin, node.end))
    if region is None:
        return None
    dml = DmlNode(node.name, inner.inputs[0], None, node.inputs[2], node.outputs[0], elem_type=node.elem_type,
                  value=node.value, begin=region[0], end=region[1], exact=node.exact and inner.exact)
    return Match("chain", [inner, node], {"dml": dml})


def _rewrite_chain(graph: Graph, m: Match, options: Options) -> list[Node]:
    inner, outer = m.nodes
    new = replace_node(graph, outer, m.captures["dml"])
    graph.remove_node(inner)
    return [new]


MASK_WHERE = Rule("mask_where", ("Where",), _match_where, _rewrite_apply, exact="bit-exact", phase=3,
                  description="Where(band, X, c) / Where(band, c, X) -> DIAGONAL_MATRIX1(X, Value c)")
MASK_ARITH = Rule("mask_arith", ("Mul", "Add"), _match_arith, _rewrite_apply, exact="equal for finite inputs",
                  phase=3, description="Mul(X, 0/1 band), Add(X, 0/-inf band) -> DIAGONAL_MATRIX1(X, fill)")
CHAIN = Rule("chain", ("DiagonalMatrix1",), _match_chain, _rewrite_chain, exact="bit-exact", phase=4,
             description="DIAGONAL_MATRIX1 of a DIAGONAL_MATRIX1 with the same value -> one node (region union)")
