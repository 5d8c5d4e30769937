"""Example rule: Abs(generator) -> one generator with |value| (bit-exact).

A generator is a DIAGONAL_MATRIX1 with no input: `value` on its band, +0 elsewhere. Abs keeps +0
as +0, so it folds into the value.
"""
from __future__ import annotations

import numpy as np

from dmlgraph.ir.graph import DmlNode, Node
from dmlgraph.passes.common import lowering_reason, replace_node, standin
from dmlgraph.rewrite import Context, Match, Replacement, Rule


def match(ctx: Context, node: Node) -> Match | None:
    gen = node.inputs[0].producer if node.inputs and node.inputs[0] is not None else None
    if not isinstance(gen, DmlNode) or gen.kind != "DiagonalMatrix1" or gen.inputs[0] is not None:
        return None  # not a generator: nothing to fold
    value = np.abs(np.asarray(gen.value))
    dml = DmlNode(node.name, None, gen.inputs[1], gen.inputs[2], standin(node.outputs[0], gen.elem_type),
                  elem_type=gen.elem_type, value=value[()], begin=gen.begin, end=gen.end,
                  static_shape=gen.static_shape)
    m = Match("abs_generator", [node], dml=dml)
    m.reason = lowering_reason(dml, node.outputs[0].shape, ctx.options)  # e.g. a rank DirectML lacks
    return m


def rewrite(ctx: Context, m: Match) -> Replacement:
    return replace_node(m.nodes[0], m.dml)  # the generator dies with its last reader


RULE = Rule("abs_generator", ("Abs",), match, rewrite, exact="bit-exact",
            description="Abs(DIAGONAL_MATRIX1 generator) -> DIAGONAL_MATRIX1 generator with |value|")
