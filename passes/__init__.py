"""The rewrite rules of dmlgraph, in the order the pipeline runs them (each phase to a fixed point).

phase -1 split_of_concat tensors stacked by Concat and split back: the tensors (stacks of bands)
phase 0  mask_subgraph   shape-only mask subgraphs -> generators (sees whole subgraphs first)
         data_mask       index grids compared with data: declined, naming the data (never rewritten)
phase 1  stored_mask     constant band masks -> generators
phase 2  trilu, eyelike  the remaining Trilu / EyeLike nodes
phase 3  mask_view, mask_where, mask_gather, mask_bool, mask_not, mask_cast, mask_arith
         masks reshaped, negated, cast, and applied to data -> DIAGONAL_MATRIX1 with that input
phase 4  chain           DIAGONAL_MATRIX1 of DIAGONAL_MATRIX1 -> one node
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
from dmlgraph.rewrite import Options, Rule

ALL_RULES: list[Rule] = [stacks.SPLIT_OF_CONCAT, masks.MASK_SUBGRAPH, data_masks.DATA_MASK, stored_masks.STORED_MASK,
                         trilu.RULE, eyelike.RULE, apply_views.MASK_VIEW, apply.MASK_WHERE, apply_gather.MASK_GATHER,
                         apply_bool.MASK_BOOL, apply_bool.MASK_NOT, apply_bool.MASK_CAST, apply_arith.MASK_ARITH,
                         apply.CHAIN]


def default_rules(options: Options | None = None) -> list[Rule]:
    """Every rule, in order. Options don't remove rules: each rule reads them itself (a rule that is
    not bit-exact declines under `exact_only`, with that reason, so `inspect` can say so)."""
    return list(ALL_RULES)
