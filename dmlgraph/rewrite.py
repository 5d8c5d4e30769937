"""Rules and the pass manager (after onnxscript's rewriter and onnx-ir's passes, kept small).

A rule is pattern + check + rewrite: `match` finds its anchor pattern around one node and returns a
Match (captures), or a Match with `reason` set when the pattern is there but the check declines
(so `inspect` can say why a Trilu was not lowered). `rewrite` changes the graph. The manager runs
all rules to a fixed point, counts rewrites per rule and keeps every decline once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from dmlgraph.graph import Graph, Node, gc_paused
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
    """pattern + check (inside `match`) + rewrite.

    `anchors` are the op types worth trying; "*" tries every node and "Initializer" offers each
    stored constant (a Value) instead of a node. `candidates`, when set, replaces the anchors: it
    returns the nodes worth trying in this sweep (an analysis may know them all at once, where
    offering every node would call `match` on each), tried after the anchored items of the sweep.
    Rules run in ascending `phase`, each phase to its own fixed point, so a rule that wants to see
    a whole subgraph runs before rules that rewrite its parts.
    """

    name: str
    anchors: tuple[str, ...]
    match: Callable[[Graph, Any, Options], Match | None]
    rewrite: Callable[[Graph, Match, Options], list[Node]]
    exact: str = "bit-exact"  # or e.g. "equal for finite inputs"
    description: str = ""
    phase: int = 0
    candidates: Callable[[Graph], list[Node]] | None = None


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

    @gc_paused
    def run(self, graph: Graph, progress: Callable[[str], None] | None = None) -> PassResult:
        counts = {r.name: 0 for r in self.rules}
        declined: dict[tuple, Match] = {}
        applied: list[Match] = []
        iterations = 0
        try:
            for phase in sorted({r.phase for r in self.rules}):
                rules = [r for r in self.rules if r.phase == phase]
                for _ in range(self.max_iterations):
                    iterations += 1
                    changed = self._sweep(graph, rules, counts, declined, applied)
                    if not changed:
                        break
                    graph.remove_dead()
                    if progress:
                        progress(f"phase {phase}, sweep {iterations}: {sum(counts.values())} rewrites")
        finally:
            graph.scratch.clear()  # sampled masks and decoded constants: not kept with the graph
        # A decline of a node that a later rewrite removed or replaced is no longer news.
        live = [m for m in declined.values()
                if all(n.id in graph.nodes for n in m.nodes) and all(i in graph.initializers for i in m.initializers)]
        return PassResult(bool(applied), counts, live, applied, iterations)

    def _sweep(self, graph, rules, counts, declined, applied) -> bool:
        by_anchor: dict[str, list[Rule]] = {}
        for r in rules:
            for a in (r.anchors if r.candidates is None else ()):
                by_anchor.setdefault(a, []).append(r)
        changed = False
        candidates: list[tuple[Any, list[Rule]]] = []
        if "Initializer" in by_anchor:
            candidates += [(v, by_anchor["Initializer"]) for v in graph.initializers.values()]
        every = by_anchor.get("*", [])
        if every:
            nodes = graph.iter_nodes()
        else:  # only the anchors' op types, in graph order
            nodes = sorted((n for op in by_anchor for n in graph.by_op.get(op, {}).values()), key=lambda n: n.added)
        per_op: dict[str, list[Rule]] = {}  # one list per op type, not one per node
        for n in nodes:
            item_rules = per_op.get(n.op_type)
            if item_rules is None:
                item_rules = per_op[n.op_type] = by_anchor.get(n.op_type, []) + every
            if item_rules:  # most nodes have no rule in a given phase
                candidates.append((n, item_rules))
        candidates += [(n, [r]) for r in rules if r.candidates is not None for n in r.candidates(graph)]
        for item, item_rules in candidates:
            for rule in item_rules:
                if isinstance(item, Node) and item.id not in graph.nodes:
                    break  # removed by an earlier rewrite in this sweep
                if not isinstance(item, Node) and item.name not in graph.initializers:
                    break
                m = rule.match(graph, item, self.options)
                if m is None:
                    continue
                if m.declined:
                    key = (rule.name, tuple(n.id for n in m.nodes), tuple(m.initializers), m.reason)
                    declined.setdefault(key, m)
                    continue
                for n in rule.rewrite(graph, m, self.options):
                    n.rule = n.rule or rule.name
                counts[rule.name] += 1
                applied.append(m)
                changed = True
                break
        return changed
