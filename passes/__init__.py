"""The rewrite rules of dmlgraph and the one table of the order they run in (`PHASES`).

Each phase runs to its own fixed point before the next starts, so a rule that wants to see a
whole subgraph (a shape-only mask cone) runs before the rules that rewrite its parts.
"""
from __future__ import annotations

from dmlgraph.passes import (
    apply,
    apply_arith,
    apply_bool,
    apply_gather,
    apply_views,
    data_masks,
    eyelike,
    masks,
    stacks,
    stored_masks,
    trilu,
)
from dmlgraph.rewrite import Rule

PHASES: list[tuple[str, list[Rule]]] = [
    ("tensors stacked by Concat and split back -> the tensors (stacks of bands)", [stacks.SPLIT_OF_CONCAT]),
    ("shape-only mask subgraphs -> generators (whole subgraphs first); index grids compared with data "
     "declined, naming the data", [masks.MASK_SUBGRAPH, data_masks.DATA_MASK]),
    ("stored band masks -> generators", [stored_masks.STORED_MASK]),
    ("the remaining Trilu / EyeLike nodes", [trilu.RULE, eyelike.RULE]),
    ("masks viewed, negated, cast, combined and applied to data -> DIAGONAL_MATRIX1 with that input",
     [apply_views.MASK_VIEW, apply.MASK_WHERE, apply_gather.MASK_GATHER, apply_bool.MASK_BOOL, apply_bool.MASK_NOT,
      apply_bool.MASK_CAST, apply_bool.MASK_COMPARE, apply_arith.MASK_ARITH]),
    ("DIAGONAL_MATRIX1 of DIAGONAL_MATRIX1 -> one node", [apply.CHAIN]),
]


def default_phases() -> list[list[Rule]]:
    """The built-in rules by phase, for `PassManager`. Options don't remove rules: each rule reads
    them itself (a rule that is not bit-exact declines under `exact_only`, with that reason)."""
    return [list(rules) for _, rules in PHASES]


def default_rules() -> list[Rule]:
    """Every built-in rule, in order."""
    return [r for _, rules in PHASES for r in rules]
