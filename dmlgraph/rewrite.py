"""Rules and the pass manager (after onnxscript's rewriter and onnx-ir's passes, kept small).

A rule is pattern + check + rewrite: `match` finds its anchor pattern around one node and returns a
Match (captures), or a Match with `reason` set when the pattern is there but the check declines
(so `inspect` can say why a Trilu was not lowered). `rewrite` changes the graph. The manager runs
all rules to a fixed point, counts rewrites per rule and keeps every decline once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from dmlgraph.graph import Graph, Node
from dmlgraph.ops import FeatureLevel


@dataclass
class Options:
    """What the user asked for: target feature level, exact-only rewrites, constant-mask threshold."""

    feature_level: FeatureLevel = FeatureLevel.L5_1
    exact_only: bool = False
    min_mask_bytes: int | None = None  # None: any mask bigger than the node replacing it


@dataclass
class Match:
    """What a rule found: the nodes and constants it covers, its captures, a reason if it declines.

    By convention `captures["dml"]` is the DmlNode the rewrite puts in place.
    """

    rule: str
    nodes: list[Node]
    captures: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None
    initializers: list[str] = field(default_factory=list)  # stored constants the rewrite makes dead

    @property
    def declined(self) -> bool:
        return self.reason is not None


@dataclass
class Rule:
    """pattern + check (inside `match`) + rewrite. `anchors` are the op types worth trying."""

    name: str
    anchors: tuple[str, ...]
    match: Callable[[Graph, Node, Options], Match | None]
    rewrite: Callable[[Graph, Match, Options], list[Node]]
    exact: str = "bit-exact"  # or e.g. "equal for finite inputs"
    description: str = ""


@dataclass
class PassResult:
    changed: bool
    counts: dict[str, int]
    declined: list[Match]
    applied: list[Match]
    iterations: int


class PassManager:
    """Runs rules over the graph until nothing changes (or `max_iterations`)."""

    def __init__(self, rules: list[Rule], options: Options | None = None, max_iterations: int = 10):
        self.rules = rules
        self.options = options or Options()
        self.max_iterations = max_iterations

    def run(self, graph: Graph, progress: Callable[[str], None] | None = None) -> PassResult:
        counts = {r.name: 0 for r in self.rules}
        declined: dict[tuple, Match] = {}
        applied: list[Match] = []
        by_anchor: dict[str, list[Rule]] = {}
        for r in self.rules:
            for a in r.anchors:
                by_anchor.setdefault(a, []).append(r)
        iterations = 0
        changed_any = False
        for iterations in range(1, self.max_iterations + 1):
            changed = False
            for node in graph.iter_nodes():
                if node.id not in graph.nodes:
                    continue  # removed by an earlier rewrite in this sweep
                for rule in by_anchor.get(node.op_type, ()):
                    m = rule.match(graph, node, self.options)
                    if m is None:
                        continue
                    if m.declined:
                        declined.setdefault((rule.name, tuple(n.id for n in m.nodes), m.reason), m)
                        continue
                    new_nodes = rule.rewrite(graph, m, self.options)
                    for n in new_nodes:
                        n.rule = n.rule or rule.name
                    counts[rule.name] += 1
                    applied.append(m)
                    changed = True
                    break
            if changed:
                graph.remove_dead()
                changed_any = True
                if progress:
                    progress(f"pass {iterations}: {sum(counts.values())} rewrites")
            else:
                break
        # A decline of a node that a later rewrite removed or replaced is no longer news.
        live = [m for m in declined.values() if all(n.id in graph.nodes for n in m.nodes)]
        return PassResult(changed_any, counts, live, applied, iterations)
