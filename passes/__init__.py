"""The rewrite rules of dmlgraph, grouped into ordered rule sets.

`default_rules(options)` is the pipeline `optimize` runs; each rule lives in its own module.
"""
from __future__ import annotations

from dmlgraph.rewrite import Options, Rule
from passes import eyelike, trilu


def default_rules(options: Options | None = None) -> list[Rule]:
    rules = [trilu.RULE, eyelike.RULE]
    if options is not None and options.exact_only:
        rules = [r for r in rules if r.exact == "bit-exact"]
    return rules
