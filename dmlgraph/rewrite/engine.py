"""Rules propose, one rewriter applies (after onnxscript's rewriter and onnx-ir's passes, kept small).

A rule's `match` returns a Match (or one with `reason`: a decline); its `rewrite` builds a
`Replacement` without touching the graph; `Rewriter.apply` is the one place that changes the graph,
and `PassManager` runs all rules to a fixed point. More: docs/internals.md, rewrite/engine.py.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import onnx

from dmlgraph.ir.graph import Dim, DmlNode, Graph, Node, OnnxNode, Value, gc_paused
from dmlgraph.ir.ops import FeatureLevel
from dmlgraph.ir.opset import default_opset, legalize


@dataclass
class Options:
    """What the user asked for: target feature level, exact-only rewrites, constant-mask threshold."""

    feature_level: FeatureLevel = FeatureLevel.L5_1
    exact_only: bool = False
    min_mask_bytes: int | None = None  # None: any mask bigger than the node replacing it
    allow_growth: bool = False  # write a lowering even where it makes the model bigger (see costs.growth)
    # Sites declined by what their lowering would cost (pipeline.lower's growth decisions): the
    # names of the nodes and constants a match covers (`site_key`) -> the reason it is declined with.
    declined_sites: dict[tuple[str, ...], str] = field(default_factory=dict)


T = TypeVar("T")


@dataclass
class Context:
    """What every `match` and `rewrite` of one PassManager run sees (tinygrad's `ctx`): the graph,
    the user's options, and the run's analyses and memo tables, which end with the run (none is
    kept on the graph)."""

    graph: Graph
    options: Options = field(default_factory=Options)
    analyses: dict[type, Any] = field(default_factory=dict)

    def analysis(self, kind: Callable[[Graph], T]) -> T:
        """The run's one `kind(graph)` (an analysis or a memo table), made on first use."""
        found = self.analyses.get(kind)  # type: ignore[call-overload]
        if found is None:
            found = self.analyses[kind] = kind(self.graph)  # type: ignore[index]
        return found


@dataclass
class Match:
    """What a rule found: the nodes and constants it covers, its captures, a reason if it declines.

    `dml` is the DmlNode the rewrite puts in place (once applied, the node the graph holds);
    `replacement` is set when the rewriter applied the rule's replacement.
    """

    rule: str
    nodes: list[Node]
    captures: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None
    initializers: list[str] = field(default_factory=list)  # stored constants the rewrite makes dead
    replacement: Replacement | None = None
    dml: DmlNode | None = None

    @property
    def declined(self) -> bool:
        return self.reason is not None


def site_key(m: Match) -> tuple[str, ...]:
    """A site as a later run of the same rules on the same model finds it again: the names of what
    the nodes it covers compute (node names may be empty) and of the stored constants it covers."""
    return (m.rule, *sorted(v.name for n in m.nodes for v in n.outputs if v is not None), *sorted(m.initializers))


def detached(name: str, elem_type: int | None = None, shape: tuple[Dim, ...] | None = None) -> Value:
    """A value not (yet) in any graph: what a rule's replacement creates. The rewriter names it
    uniquely when it adds it."""
    return Value(name, elem_type, shape)


def detached_constant(name: str, array: np.ndarray) -> Value:
    """A new constant for a replacement's `initializers` (held as an array until export)."""
    v = Value(name)
    v.array = np.asarray(array)
    v.elem_type = onnx.helper.np_dtype_to_tensor_dtype(v.array.dtype)
    v.shape = tuple(v.array.shape)
    return v


@dataclass
class Replacement:
    """A rule's proposed change, as data (onnxscript's ReplacementSubgraph, for this IR).

    nodes         new nodes in dependency order; they read existing values, `initializers`, or
                  outputs of earlier new nodes, and produce detached values (see `detached`)
    initializers  new constants (see `detached_constant`)
    replaces      (old, new): existing value `old` is from now on produced by the new node that
                  produces `new` (old keeps its name, uses and graph-output place; `new` only
                  stands for it, and may refine its shape)
    removes       existing nodes that become dead: each of their outputs must be replaced, or
                  read by nothing that stays
    """

    nodes: list[Node] = field(default_factory=list)
    initializers: list[Value] = field(default_factory=list)
    replaces: list[tuple[Value, Value]] = field(default_factory=list)
    removes: list[Node] = field(default_factory=list)
    exact: bool = True
    rule: str = ""  # set by the pass manager: the rule that proposed it


class RewriteRefused(Exception):
    """A replacement that would leave the graph invalid; the pass manager records it as a decline."""


class Rewriter:
    """Applies Replacements to one graph, keeping it valid, and records what it applied.

    Invariants kept: single assignment (a value has at most one producer), every use has a
    producer, an initializer or a graph input, a multi-output node is removed only when none of
    its outputs is left without a producer, replaced values keep their element type and rank.
    In an If/Loop/Scan body, a value of an enclosing scope is read as it is, replaced only in the
    body's scope (`Graph.rewire_scope`), and a node of an enclosing scope is never removed.
    What a replacement leaves unread (the producers of the removed nodes' inputs, recursively,
    and constants) is removed by `collect_dead`, a walk of the whole graph once per sweep; after
    that walk each apply removes what it left unread itself, so later walks are skipped (a walk
    costs more than the few nodes one rewrite leaves behind, but less than many rewrites' worth).
    """

    def __init__(self, graph: Graph):
        self.graph = graph
        self.applied: list[Replacement] = []
        self._dirty = True  # the graph may hold nodes no output depends on
        self._keep: set[str] | None = None  # graph outputs' names (what bodies read is a use)

    def collect_dead(self) -> int:
        """Remove nodes and initializers no graph output depends on (a no-op while the graph is
        known clean)."""
        if not self._dirty:
            return 0
        removed = self.graph.remove_dead()
        self._dirty, self._keep = False, None
        return removed

    def finish(self) -> None:
        """Tell the graph it holds nothing dead when that is known (its next `remove_dead` returns
        at once)."""
        if not self._dirty:
            self.graph.mark_clean()

    def apply(self, r: Replacement) -> list[Node]:
        """Check, then apply `r`; returns the new nodes as the graph holds them.

        Raises RewriteRefused (the graph unchanged) when `r` would break an invariant.
        """
        g = self.graph
        reason = legalize(r.nodes, r.initializers, default_opset(g.info.opset_imports))
        if reason:
            raise RewriteRefused(reason)
        r.removes = [n for n in r.removes if n.id in g.nodes or not g.sees(n)]  # (an enclosing scope keeps its own)
        standin = self._check(r)
        scoped = [(old, new) for old, new in r.replaces if id(new) not in standin]  # (enclosing values)
        replaced = [old.producer for old, _ in r.replaces if old.producer is not None] + r.removes
        instead = min((n.place[0] for n in replaced), default=None)  # (the new nodes' place in the export order)
        for v in r.initializers:
            self._adopt(v)
            g.initializers[v.name] = v
        for n in r.removes:
            g.remove_node(n)
        for old, new in r.replaces:
            if id(new) not in standin:
                continue
            if old.name in g.initializers:  # a stored constant becomes computed
                del g.initializers[old.name]
                old.initializer = old.array = None
            if new.shape is not None:
                old.shape = new.shape  # what the rule proved beats what shape inference guessed
            if old.elem_type is None:
                old.elem_type = new.elem_type
        for n in r.nodes:
            ins, outs = n.inputs, n.outputs
            for i, inp in enumerate(ins):
                if inp is not None and id(inp) in standin:
                    ins[i] = standin[id(inp)]
            for i, out in enumerate(outs):
                if id(out) in standin:
                    outs[i] = standin[id(out)]
                else:
                    self._adopt(out)
            if isinstance(n, OnnxNode) and not n.name:
                n.name = n.outputs[0].name  # named by what it makes, once its output's name is unique
            n.rule = n.rule or r.rule
            g.add_node(n, instead)
        for old, new in scoped:
            new.elem_type, new.shape = new.elem_type or old.elem_type, new.shape or old.shape
            g.rewire_scope(old, new)
        if not self._dirty:  # (else the next walk finds what became dead all at once: cheaper)
            keep = self._keep_names()
            if r.removes:
                self._release([v for n in r.removes for v in n.inputs if v is not None], keep)
            for n in r.nodes:  # a new node nothing reads is dead: left to the next walk
                if not any(v.uses or v.name in keep for v in n.outputs):
                    self._dirty = True
        self.applied.append(r)
        return r.nodes

    def _keep_names(self) -> set[str]:
        """Names kept alive without a reader: graph outputs (a value a body reads has a use)."""
        keep = self._keep
        if keep is None:
            keep = self._keep = {v.name for v in self.graph.outputs}
        return keep

    def _release(self, values: list[Value], keep: set[str]) -> None:
        """Remove what only the just-removed nodes read: producers none of whose outputs is read
        any more (recursively), and constants nothing reads."""
        g = self.graph
        stack = values
        while stack:
            v = stack.pop()
            if v.uses or v.name in keep:
                continue
            p = v.producer
            if p is None:
                if v.name in g.initializers and v.name not in g.overridable_inputs:
                    del g.initializers[v.name]
                continue
            if p.id not in g.nodes or (len(p.outputs) > 1 and any(o.uses or o.name in keep for o in p.outputs)):
                continue
            g.remove_node(p)
            if isinstance(p, OnnxNode) and p.outer:
                self._dirty = True  # what its body read may be dead now: the next walk finds it
            for i in p.inputs:
                if i is not None:
                    stack.append(i)

    def _adopt(self, v: Value) -> None:
        """Register a detached value under a name no other value has, nor other scopes of the model
        use (`Graph.reserved`: a lowered If/Loop/Scan body must not redefine an enclosing name)."""
        g = self.graph
        base = v.name
        while v.name in g.values or v.name in g.reserved:
            v.name = g.fresh_name(base)
        g.values[v.name] = v

    def _check(self, r: Replacement) -> dict[int, Value]:
        """Raise RewriteRefused unless applying `r` keeps the invariants (cost: the size of `r`).
        Returns {id(new): old} for `r.replaces`."""
        g = self.graph
        removed = set()
        for n in r.removes:
            if n.id not in g.nodes:
                raise RewriteRefused(f"node {n.name!r} is not in the graph (removed by an earlier rewrite)")
            removed.add(n.id)
        replaced: dict[int, Value] = {}  # id(new) -> old
        old_ids = set()
        for old, new in r.replaces:
            if g.is_outer(old):
                continue  # (an enclosing scope's value: replaced in this scope only, `apply`)
            p = old.producer
            if p is not None:
                if p.id not in removed:
                    raise RewriteRefused(f"{old.name!r} would have two producers ({p.name!r} is not removed)")
            elif old.name not in g.initializers:
                raise RewriteRefused(f"{old.name!r} is a graph input; only computed values and "
                                     "stored constants can be replaced")
            elif old.name in g.overridable_inputs:
                raise RewriteRefused(f"{old.name!r} is an input the caller may override")
            if old.elem_type is not None and new.elem_type is not None and old.elem_type != new.elem_type:
                raise RewriteRefused(f"the replacement of {old.name!r} has element type "
                                     f"{new.elem_type}, not {old.elem_type}")
            if new.shape is not None and old.shape is not None and new.shape != old.shape \
                    and not _shape_compatible(old.shape, new.shape):
                raise RewriteRefused(f"the replacement of {old.name!r} has shape {new.shape}, not {old.shape}")
            replaced[id(new)] = old
            old_ids.add(id(old))
        made = set(map(id, r.initializers))
        produced = 0
        for n in r.nodes:
            for v in n.inputs:
                if v is None or id(v) in made or id(v) in replaced:
                    continue
                p = v.producer
                if g.is_outer(v):
                    continue  # (an enclosing scope's value: a body reads it as it is)
                if p is None:
                    if g.values.get(v.name) is not v or (v.name not in g.initializers and not _is_input(g, v)):
                        raise RewriteRefused(f"new node {n.name!r} reads {v.name!r}, which nothing produces")
                elif p.id in removed or p.id not in g.nodes:
                    raise RewriteRefused(f"new node {n.name!r} reads {v.name!r}, whose producer is removed")
            for v in n.outputs:
                if id(v) in replaced:
                    produced += 1
                elif v.producer is not None or g.values.get(v.name) is v:
                    raise RewriteRefused(f"new node {n.name!r} writes {v.name!r}, which already exists")
                made.add(id(v))
        if produced != len(replaced):
            raise RewriteRefused("a replaced value has no new producer, or two")
        for n in r.removes:
            for v in n.outputs:
                if id(v) not in old_ids and (any(u.id not in removed for u, _ in v.uses) or g.is_graph_output(v)):
                    raise RewriteRefused(f"removing {n.name!r} would leave its output {v.name!r} "
                                         "without a producer (it is still read)")
        return replaced


def _shape_compatible(old: tuple[Dim, ...], new: tuple[Dim, ...]) -> bool:
    """Same rank, and no static size changes (a symbolic or unknown one may become known)."""
    return len(old) == len(new) and all(not (isinstance(a, int) and isinstance(b, int)) or a == b
                                        for a, b in zip(old, new))


def _is_input(g: Graph, v: Value) -> bool:
    return v in g.inputs  # (a Value equals only itself)


@dataclass
class Rule:
    """pattern + check (inside `match`) + replacement (`rewrite`, pure).

    `anchors` are the op types worth trying; "*" tries every node and "Initializer" offers each
    stored constant (a Value) instead of a node. `candidates`, when set, replaces the anchors: it
    returns the nodes (or stored constants) worth trying in this sweep (an analysis may know them
    all at once, where offering every node would call `match` on each), tried after the anchored
    items of the sweep.
    """

    name: str
    anchors: tuple[str, ...]
    match: Callable[[Context, Any], Match | None]
    rewrite: Callable[[Context, Match], Replacement]
    exact: str = "bit-exact"  # or e.g. "equal for finite inputs"
    description: str = ""
    candidates: Callable[[Context], Sequence[Node | Value]] | None = None


@dataclass
class PassResult:
    changed: bool
    counts: dict[str, int]
    declined: list[Match]
    applied: list[Match]
    iterations: int
    # Declines some of whose nodes a later rewrite removed: no longer news for the list of declines,
    # still the reason for the nodes they leave (the mask census reads them).
    superseded: list[Match] = field(default_factory=list)
    # The mask census of the bodies and functions (`nested`), when asked for: rows with their scope.
    census: list[dict] = field(default_factory=list)


class PassManager:
    """Runs rules in phases, each phase over the graph until nothing changes (or `max_iterations`),
    through one Rewriter. A rule that wants to see a whole subgraph sits in an earlier phase than
    the rules that rewrite its parts (the built-in order: `dmlgraph.passes.PHASES`)."""

    def __init__(self, phases: Sequence[Sequence[Rule]], options: Options | None = None, max_iterations: int = 10):
        self.phases = [list(rules) for rules in phases if rules]
        self.rules = [r for rules in self.phases for r in rules]
        self.options = options or Options()
        self.max_iterations = max_iterations
        self._plans: list[_Plan] | None = None  # per phase, made on the first run (one per manager)

    def _phase_plans(self) -> list[_Plan]:
        if self._plans is None:
            self._plans = [_Plan(rules, phase) for phase, rules in enumerate(self.phases)]
        return self._plans

    @gc_paused
    def run(self, graph: Graph, progress: Callable[[str], None] | None = None,
            shared: Sequence[object] = ()) -> PassResult:
        """All phases on `graph`; `shared`: analyses this run starts with instead of making them
        (a caller that reads one after the run, or keeps one across runs)."""
        ctx = Context(graph, self.options, {type(a): a for a in shared})
        rewriter = Rewriter(graph)
        counts = {r.name: 0 for r in self.rules}
        declined: dict[tuple[Any, ...], Match] = {}
        applied: list[Match] = []
        iterations = 0
        for plan in self._phase_plans():
            for _ in range(self.max_iterations):
                iterations += 1
                changed = self._sweep(ctx, rewriter, plan, counts, declined, applied)
                if not changed:
                    break
                rewriter.collect_dead()
                if progress:
                    progress(f"phase {plan.phase}, sweep {iterations}: {sum(counts.values())} rewrites")
        rewriter.finish()
        # A decline of a node that a later rewrite removed or replaced is no longer news.
        live, superseded = [], []
        for m in declined.values():
            kept = [graph.sees(n) for n in m.nodes]
            if all(kept) and all((v := graph.find(i)) is not None and graph.stored(v) for i in m.initializers):
                live.append(m)
            elif any(kept):
                superseded.append(m)
        return PassResult(bool(applied), counts, live, applied, iterations, superseded)

    def _sweep(self, ctx: Context, rewriter: Rewriter, plan: _Plan, counts: dict[str, int],
               declined: dict[tuple[Any, ...], Match], applied: list[Match]) -> bool:
        graph = ctx.graph
        changed = False
        for item, item_rules in plan.candidates(ctx):
            for rule in item_rules:
                if isinstance(item, Node) and item.id not in graph.nodes:
                    break  # removed by an earlier rewrite in this sweep
                if not isinstance(item, Node) and not graph.stored(item):
                    break
                m = rule.match(ctx, item)
                if m is None:
                    continue
                if not m.declined and ctx.options.declined_sites:
                    m.reason = ctx.options.declined_sites.get(site_key(m))
                if not m.declined:
                    try:
                        m.replacement = replacement = rule.rewrite(ctx, m)
                        replacement.rule = rule.name
                        new = rewriter.apply(replacement)
                    except RewriteRefused as e:
                        m.reason = f"the rewrite would leave the graph invalid: {e}"
                    else:
                        for n in new:
                            if isinstance(n, DmlNode):
                                m.dml = n
                        counts[rule.name] += 1
                        applied.append(m)
                        changed = True
                        break
                key = (rule.name, tuple(n.id for n in m.nodes), tuple(m.initializers), m.reason)
                declined.setdefault(key, m)
        return changed


class _Plan:
    """One phase's rules by what they are offered, worked out once per PassManager (a run per
    If/Loop/Scan body made this setup a fixed cost per body)."""

    def __init__(self, rules: list[Rule], phase: int):
        self.phase = phase
        self.by_anchor: dict[str, list[Rule]] = {}
        for r in rules:
            for a in (r.anchors if r.candidates is None else ()):
                self.by_anchor.setdefault(a, []).append(r)
        self.every = self.by_anchor.get("*", [])
        self.ops = [op for op in self.by_anchor if op not in ("*", "Initializer")]
        self.own = [(r, r.candidates) for r in rules if r.candidates is not None]  # rules naming their own

    def candidates(self, ctx: Context) -> list[tuple[Any, list[Rule]]]:
        """(item, the rules to try on it) for one sweep: stored constants, anchored nodes in graph
        order, then each rule's own candidates."""
        graph, by_anchor = ctx.graph, self.by_anchor
        candidates: list[tuple[Any, list[Rule]]] = []
        if "Initializer" in by_anchor:
            candidates += [(v, by_anchor["Initializer"]) for v in graph.initializers.values()]
        every = self.every
        nodes: Iterable[Node]
        if every:
            nodes = graph.iter_nodes()
        else:  # only the anchors' op types, in graph order
            present = [found for found in map(graph.by_op.get, self.ops) if found]
            nodes = present[0].values() if len(present) == 1 else \
                sorted((n for found in present for n in found.values()), key=lambda n: n.added)
        per_op: dict[str, list[Rule]] = {}  # one list per op type, not one per node
        for n in nodes:
            item_rules = per_op.get(n.op_type)
            if item_rules is None:
                item_rules = per_op[n.op_type] = by_anchor.get(n.op_type, []) + every
            if item_rules:  # most nodes have no rule in a given phase
                candidates.append((n, item_rules))
        candidates += [(n, [r]) for r, offered in self.own for n in offered(ctx)]
        return candidates


__all__ = ["Context", "Match", "Options", "PassManager", "PassResult", "Replacement", "RewriteRefused",
           "Rewriter", "Rule", "detached", "site_key", "detached_constant"]
