"""Masks inside If/Loop/Scan bodies and model-local functions, lowered in place.

The passes work on one flat Graph, so each body becomes one while it is lowered (formal inputs typed
from the node that runs it, outer reads as extra inputs or borrowed constants) and is written back
under the same attribute. Bodies go after the graph that holds them; what cannot be typed is
declined with the reason. How bodies are typed, imported together and reused, and the scope paths
in reports: docs/internals.md, rewrite/nested.py.
"""
from __future__ import annotations

import collections
import functools
import itertools
import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Iterator, Sequence, cast

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from dmlgraph.errors import DmlgraphError
from dmlgraph.io.modelfile import iter_graphs
from dmlgraph.io.onnx_io import (
    DOMAIN,
    DOMAIN_VERSION,
    build_graph,
    dml_node_proto,
    export_model,
    graphs_of,
    has_dml_nodes,
    import_model,
    onnx_node_proto,
    set_bodies,
)
from dmlgraph.io.shape_inference import CHILD_MIN_NODES, PendingShapes, ValueType, type_shape, whole_value_types
from dmlgraph.ir.graph import CONTROL_FLOW, DmlNode, Graph, ModelInfo, Node, OnnxNode, Value, free_names, rewire_body
from dmlgraph.rewrite import Match, PassResult, body_reuse, call_leaves
from dmlgraph.rewrite.call_leaves import STANDARD, FunctionKey, call_key, proto_call_key

TypeSpec = tuple[int, "tuple | None"]  # ONNX element type, shape (None: unknown rank)
Written = body_reuse.Written
FlatPasses = Callable[[Graph], PassResult]  # the ordinary passes on one graph
Explain = Callable[[Graph, dict[str, str]], list[Match]]  # declines for masks reading varying values
# The mask census of a body: given its graph before the passes and what its inputs are outside (a
# size, an index grid, a mask: `Kinds` of the enclosing graph), what turns the graph after them and
# their result into rows (`dmlgraph.mask_census.body_census`, `kinds`; the census lives above this layer).
Census = Callable[[Graph, dict[str, str]], Callable[[Graph, PassResult], list[dict]]]
Kinds = Callable[[Graph, dict[str, str]], dict[str, str]]  # (a graph, its own inputs' hints)

FRESH_PREFIX = body_reuse.FRESH  # `FreshDims`
SCOPE, LOWERED = "scope", "lowered"  # the captures this module adds to the matches it reports


# ---- what reports show ---------------------------------------------------------------------------
def qualified_name(m: Match, n: Node) -> str:
    """`n`'s name, prefixed with the path of the body it is in when the match is a nested one."""
    scope = m.captures.get(SCOPE)
    return f"{scope}/{n.name or n.op_type}" if scope else n.name


def in_lowered_graph(m: Match, g: Graph) -> bool:
    """Whether the DML node a match made is in the lowered model (its body's graph, if nested)."""
    if SCOPE in m.captures:
        return bool(m.captures.get(LOWERED))
    dml = m.dml
    return isinstance(dml, DmlNode) and dml.id in g.nodes


def nested_dml_nodes(result: PassResult) -> list[DmlNode]:
    """The DML nodes the nested lowerings put into bodies and functions (and that stayed there)."""
    return [m.dml for m in result.applied
            if m.captures.get(LOWERED) and isinstance(m.dml, DmlNode)]


# ---- the driver ----------------------------------------------------------------------------------
def optimize_nested(g: Graph, flat: FlatPasses, explain: Explain, census: Census | None = None,
                    kinds: Kinds | None = None, portable: bool | None = None, reuse: bool = True) -> PassResult:
    """`flat` on `g`, then on every If/Loop/Scan body and model-local function, written back in
    place; one PassResult for all of them. `census`: take the mask census of each body and function
    too (its rows, each with its `scope`, in `PassResult.census`; the main graph's is the caller's).
    `portable`: the export writes the portable target (with this `exact_only`): each lowered body's
    portable form is written too, from the typed copy the rules ran on (`Graph.portable`).
    `reuse`: lower a body as another's template renamed (`body_reuse`); off where the rules decline
    sites by their names (`Options.declined_sites`), which a template in tokens does not have."""
    holders = _holders(g)
    if not holders and not g.info.functions:
        return flat(g)  # (nearly every model: no bodies, no functions)
    g.reserved |= _subgraph_names(holders)
    visible = frozenset(v.name for v in g.inputs) if g.info.functions else frozenset()
    traced = _traced(g, g.info.functions, visible)  # (the calls' arguments as the graph computes them before the rules)
    driver = _Driver(flat, explain, flat(g), g)
    driver.portable = portable
    driver.reuse = reuse
    driver.visible = visible
    driver.calls.total = call_leaves.count_calls(g, g.info.functions)
    driver.calls.cones_of(traced)
    driver.census = census
    driver.calls.kinds = kinds if census else None
    driver.calls.record(g)
    driver.lower_bodies(g, "")
    driver.lower_functions(g)
    return driver.result()


class _Driver:
    """One optimize's walk over the bodies and functions, and what it reports."""

    def __init__(self, flat: FlatPasses, explain: Explain, main: PassResult, main_graph: Graph) -> None:
        functions = main_graph.info.functions
        self.flat, self.explain = flat, explain
        self.counts = dict(main.counts)
        self.applied, self.declined = list(main.applied), list(main.declined)
        self.iterations = main.iterations
        self.dims = FreshDims(lambda: _fresh_like_dims(main_graph))
        self.calls = _CallSites(functions, self.dims)
        self.templates: dict[tuple, body_reuse.Template | None] = {}  # None: that key is lowered body by body
        self.memo: dict = {}  # `body_reuse.key`'s, for one optimize
        self.sightings: collections.Counter = collections.Counter()  # key -> bodies seen with it
        self.superseded = list(main.superseded)
        self.census: Census | None = None
        self.parent_kinds = _Lazy(dict)  # the `Kinds` of the graph whose bodies are being lowered
        self.hints_of: dict[int, dict[str, str]] = {}  # id(graph) -> its census hints, while it is lowered
        self.rows: list[dict] = []  # the bodies' census rows
        self.template_rows: dict[tuple, list[dict]] = {}  # a template's rows, in tokens
        self.visible: frozenset[str] = frozenset()  # main-graph inputs a call may pass as a leaf
        self.portable: bool | None = None  # `optimize_nested`'s
        self.reuse = True  # `optimize_nested`'s

    def result(self) -> PassResult:
        return PassResult(bool(self.applied), self.counts, self.declined, self.applied, self.iterations,
                          self.superseded, self.rows)

    def _rows(self, scope: str, rows: list[dict]) -> None:
        self.rows += [r | {"scope": scope} for r in rows]

    def _add(self, scope: str, result: PassResult, g: Graph) -> None:
        for m in result.applied:
            dml = m.dml
            m.captures.update({SCOPE: scope, LOWERED: isinstance(dml, DmlNode) and dml.id in g.nodes})
        for m in result.declined:
            m.captures[SCOPE] = scope
        self._count(result)

    def _count(self, result: PassResult) -> None:
        for rule, n in result.counts.items():
            self.counts[rule] = self.counts.get(rule, 0) + n
        self.iterations += result.iterations
        self.applied += result.applied
        self.declined += result.declined
        self.superseded += result.superseded

    def _decline(self, scope: str, rule: str, nodes: list[Node], reason: str) -> None:
        m = Match(rule, nodes, reason=reason)
        if scope:
            m.captures[SCOPE] = scope
        self.declined.append(m)

    # -- If/Loop/Scan bodies
    def lower_bodies(self, parent: Graph, scope: str, varying: dict[str, str] | None = None) -> bool:
        """Lower every body of `parent`'s nodes (`scope`: `parent`'s own path, '' for the main
        graph; `varying`: `parent`'s values that change per iteration of an enclosing Loop/Scan);
        True if any body was written back."""
        found = []  # (node, attribute index, [(label, body)])
        for node in _holders(parent):
            for i, a in enumerate(node.attributes):
                if a.type == onnx.AttributeProto.GRAPH:  # (the body Graph as written: unchanged, as read)
                    body = node.bodies.get(a.name)
                    found.append((node, i, [(a.name, a.g if body is None or body.source is None else body.source)]))
                elif a.type == onnx.AttributeProto.GRAPHS:
                    found.append((node, i, [(f"{a.name}[{j}]", b) for j, b in enumerate(a.graphs)]))
        each = [(node, node.attributes[i].name, body) for node, i, bodies in found for _, body in bodies]
        specs = [_body_spec(parent, node, attr, proto, self.dims, varying or {}) for node, attr, proto in each]
        keys = [self._key(parent, node, attr, proto, s, varying or {}) if isinstance(s, _Spec) and self.reuse else None
                for (node, attr, proto), s in zip(each, specs)]
        self.sightings.update(k[0] for k in keys if k is not None)
        reused = [k is not None and self.sightings[k[0]] > 1 for k in keys]
        built = built_bodies(parent, [s for s, r in zip(specs, reused) if not r])
        kinds = _Lazy(lambda: self.calls.kinds(parent, self.hints_of.get(id(parent), {})) if self.calls.kinds else {})
        plan = iter(zip(specs, keys, reused))
        touched: dict[OnnxNode, list[onnx.AttributeProto]] = {}
        forms: dict[OnnxNode, dict[str, onnx.GraphProto]] = {}  # the lowered bodies' portable forms
        for node, i, bodies in found:
            a = node.attributes[i]
            new = []
            for label, body in bodies:
                spec, k, r = next(plan)
                path = f"{scope}{node.name or node.op_type}/{label}"
                self.parent_kinds = kinds  # (a nested lower_bodies sets its own)
                done = self._reuse(parent, node, a.name, spec, k, path, varying or {}) if r else None
                if done is None:
                    made = next(built) if not r else _build_alone(parent, cast(_Spec, spec))
                    done = (self._lower_body(parent, node, a.name, label, body, made, scope, varying or {}),)
                new.append(done[0])
            if any(b is not None for b in new):
                kept = [b[0] if b is not None else old for b, (_, old) in zip(new, bodies)]
                touched.setdefault(node, list(node.attributes))[i] = _graph_attribute(a, kept)
                if a.type == onnx.AttributeProto.GRAPH and new[0] is not None and new[0][1] is not None:
                    forms.setdefault(node, {})[a.name] = new[0][1]
        for node, attributes in touched.items():
            set_bodies(parent, node, attributes)  # (its outer reads may have changed: remove_dead looks again)
            for name, form in forms.get(node, {}).items():
                b = node.bodies[name]
                b.portable = (cast(onnx.GraphProto, b.source), form)
        return bool(touched)

    def _key(self, parent: Graph, node: OnnxNode, attr: str, proto: onnx.GraphProto, s: _Spec,
             outer_varying: dict[str, str]) -> tuple | None:
        """The body's `body_reuse.key`, and what its template is built from."""
        context = (node.op_type, node.domain, attr, parent.info.ir_version,
                   tuple(sorted(parent.info.opset_imports.items())))
        varying = _body_varying(node, attr, proto, s.outer, outer_varying)
        return body_reuse.key(s.proto, s.inputs, s.constants, s.borrowed, s.outer, varying, context, self.calls.keys,
                              self.memo)

    def _reuse(self, parent: Graph, node: OnnxNode, attr: str, spec: _Spec | str, k: tuple | None, path: str,
               outer_varying: dict[str, str]) -> tuple[Written | None] | None:
        """The body lowered as its key's template renamed (a 1-tuple of what `_lower_body` returns), or
        None when it is to be lowered itself."""
        assert isinstance(spec, _Spec) and k is not None  # (a body with a key)
        key, c, cproto = k
        if key not in self.templates:
            cspec = _Spec(cproto, [body_reuse.canonical_input(vi, c) for vi in spec.inputs],
                          [body_reuse.canonical_tensor(t, c) for t in spec.constants],
                          {c.to_token(name): body_reuse.canonical_constant(const, c) for name, const in spec.borrowed.items()},
                          frozenset(map(c.to_token, spec.outer)), frozenset(map(c.to_token, spec.copied)))
            cvarying = {c.to_token(name): what for name, what in _body_varying(node, attr, spec.proto, spec.outer,
                                                                               outer_varying).items()}
            rows: list[dict] = []
            hints = {c.to_token(name): kind for name, kind in self._hints([vi.name for vi in spec.inputs],
                                                                          spec.outer).items()}
            self.templates[key] = self._template(parent, cspec, c, cvarying, rows, hints)
            self.template_rows[key] = rows
        template = self.templates[key]
        made = None if template is None else template.instance(c, EnclosingNames(parent, set()), path)
        if made is None:
            return None
        result, explained, written = made
        self._count(result)
        self.declined += explained
        self._rows(path, [body_reuse.renamed_row(r, c) for r in self.template_rows[key]])
        return (written,)

    def _hints(self, inputs: list[str], outer: frozenset[str]) -> dict[str, str]:
        """What the enclosing values a body takes as inputs are in the enclosing graph (census only)."""
        if self.census is None or not any(name in outer for name in inputs):
            return {}
        kinds = self.parent_kinds.get()
        return {name: kinds[name] for name in inputs if name in outer and name in kinds}

    def _template(self, parent: Graph, cspec: _Spec, c: body_reuse.Canonical, varying: dict[str, str],
                  rows: list[dict], hints: dict[str, str]) -> body_reuse.Template | None:
        """The lowering of a body in tokens (None: its bodies are lowered each as usual)."""
        g = _import(parent.info, cspec.proto, cspec.inputs, parent.info.opset_imports, cspec.constants)
        if isinstance(g, str) or body_reuse.has_invented_dims(g):
            return None
        body = _finish(parent, cspec, g)

        def run(g: Graph) -> tuple[PassResult, list[Match], Written | None]:
            finish = self.census(g, hints) if self.census else None
            result = self.flat(g)
            g.remove_dead()
            explained = self.explain(g, varying) if varying else []
            if finish is not None:
                rows.extend(r for r in finish(g, replace(result, declined=explained + result.declined))
                            if r["value"] not in cspec.copied)
            if not result.applied:
                return result, explained, None
            g.remove_dead()
            return result, explained, self._write_back(body, cspec.proto)
        return body_reuse.Template.lower(g, c, run)

    def _lower_body(self, parent: Graph, node: OnnxNode, attr: str, label: str, proto: onnx.GraphProto,
                    body: Body | str, scope: str, outer_varying: dict[str, str]) -> Written | None:
        """The lowered body (`body`: it as built, or why it cannot be), or None when nothing in it (or
        in its own bodies) changed."""
        path = f"{scope}{node.name or node.op_type}/{label}"
        if isinstance(body, str):
            self._decline(scope.rstrip("/"), "nested_body", [node], f"its {label} is not lowered: {body}")
            self.calls.untyped(proto, f"it is called in {path}, which is not lowered")
            return None
        g = body.graph
        hints = self.hints_of[id(g)] = self._hints([v.name for v in g.inputs], body.outer)
        finish = self.census(g, hints) if self.census else None
        self.calls.cones_of(_traced(g, g.info.functions, self.visible))
        result = self.flat(g)
        g.remove_dead()
        self._add(path, result, g)
        varying = _body_varying(node, attr, proto, body.outer, outer_varying)
        explained = self.explain(g, varying) if varying else []
        for m in explained:
            m.captures[SCOPE] = path
            self.declined.append(m)
        if finish is not None:  # (a copied enclosing value is a site of the enclosing graph's census)
            self._rows(path, [r for r in finish(g, replace(result, declined=explained + result.declined))
                              if r["value"] not in body.copied])
        self.calls.record(g, hints)
        changed = self.lower_bodies(g, path + "/", varying)
        del self.hints_of[id(g)]
        if not result.applied and not changed:
            return None
        g.remove_dead()
        return self._write_back(body, proto)

    def _write_back(self, body: Body, proto: onnx.GraphProto) -> Written:
        """The lowered body as `write_back` writes it, and as the portable target does (if it is the
        export's: the portable form first, as the main graph's export reads the matrix hints)."""
        form = None if self.portable is None else write_back_portable(body, proto, self.portable)
        written = write_back(body, proto)
        if form is not None and not free_names(form) <= free_names(written):
            form = None  # (it reads an enclosing value the body as written does not: the enclosing graph may drop it)
            for n in body.graph.nodes.values():  # (then written without its graph: `pipeline._exact` asks again)
                if isinstance(n, DmlNode):
                    n.portable_form = None
        if form is not None:  # (the constants of forms the export tried and did not write)
            kept = {t.name for t in written.initializer} | _read_names(form)
            _drop(form.initializer, lambda t: t.name not in kept)
        return written, form

    # -- model-local functions
    def lower_functions(self, main: Graph) -> None:
        """Lower each function with the input types its call sites agree on, callers first."""
        functions = main.info.functions
        order = _call_order(functions)
        if isinstance(order, str):
            self._decline("", "local_function", [], order)
            return
        self.visible = frozenset()  # (a call inside a function sees no main-graph input)
        for i in order:
            f = functions[i]
            path = function_path(f)
            types = self.calls.types(f)
            reason = types if isinstance(types, str) else _attribute_reason(f)
            prelude: Prelude = ([], frozenset(), frozenset())
            added: list[tuple[str, TypeSpec, str]] = []  # new formals for leaves: name, type, the calls' value
            if not reason:
                opset = (dict(main.info.opset_imports) | {o.domain: o.version for o in f.opset_import}).get("", 0)
                definitions, leaves = self.calls.definitions(f, opset)
                prelude, added = _prelude(f, definitions, leaves)
            g = reason or build_function(main.info, f, cast(list[TypeSpec], types), self.dims, prelude, added)
            if isinstance(g, str) and prelude[0]:  # (what the calls define does not import: typed as before)
                prelude, added = ([], frozenset(), frozenset()), []
                g = build_function(main.info, f, cast(list[TypeSpec], types), self.dims)
            if isinstance(g, str):
                self._decline("", "local_function", [], f"function {path} is not lowered: {g}")
                self.calls.untyped_nodes(f.node, f"it is called by function {path}, which is not lowered")
                continue
            _, made, defined = prelude
            hints = self.calls.hints(f) if self.census else {}
            hints = self.hints_of[id(g)] = {name: kind for name, kind in hints.items() if name not in defined}
            finish = self.census(g, hints) if self.census else None
            self.calls.cones_of(_traced(g, functions))
            result = self.flat(g)
            g.remove_dead()
            self._add(path, result, g)
            if finish is not None:  # (the prelude's sites are the callers')
                self._rows(path, [r for r in finish(g, result) if r["value"] not in made])
            self.calls.record(g, hints)
            changed = self.lower_bodies(g, path + "/")
            del self.hints_of[id(g)]
            if result.applied or changed:
                g.remove_dead()
                new = write_back_function(g, f, defined)
                if not changed and made and all(o.name in made for m in result.applied for n in m.nodes
                                                for o in n.outputs):
                    new = f  # (only the prelude was rewritten, which write-back drops: the function is as it was)
                new = self._pass_leaves(main, f, new, added)
                kept = {o for n in all_nodes(new.node) if n.domain == DOMAIN for o in n.output}
                for m in result.applied:
                    if m.captures.get(LOWERED) and isinstance(m.dml, DmlNode):
                        m.captures[LOWERED] = m.dml.outputs[0].name in kept
                functions[i] = new


    def _pass_leaves(self, main: Graph, f: onnx.FunctionProto, new: onnx.FunctionProto,
                     added: list[tuple[str, TypeSpec, str]]) -> onnx.FunctionProto:
        """`new` with the leaf formals its nodes still read appended to its inputs, and every call
        passing them (`call_leaves`); an input costs no node, so the growth gate sees none."""
        if new is f or not added:
            return new
        read = {name for n in all_nodes(new.node) for name in n.input} | \
            {name for n in all_nodes(new.node) for b in graphs_of(n.attribute) for name in free_names(b)}
        needed = [(name, leaf) for name, _, leaf in added if name in read]
        if needed:
            edited = call_leaves.pass_leaves(main, function_key(f), len(f.input), [leaf for _, leaf in needed])
            assert edited == self.calls.total[function_key(f)]  # (`definitions` counted them)
            new.input.extend(name for name, _ in needed)
        return new


def _holders(g: Graph) -> list[OnnxNode]:
    """The nodes of `g` with graph-valued attributes, in graph order."""
    return [n for n in g.nodes.values() if n.__class__ is OnnxNode
            and (n.op_type in CONTROL_FLOW or n.domain not in STANDARD) and n.has_subgraph]


def _subgraph_names(holders: list[OnnxNode]) -> set[str]:
    """Every name used inside the bodies of these nodes, at any depth."""
    names: set[str] = set()
    for n in holders:
        for body in graphs_of(n.attributes):
            names |= _graph_names(body)
    return names


def _graph_names(body: onnx.GraphProto) -> set[str]:
    """The names `body` and its own bodies read, define or take as inputs ('' left out)."""
    names: set[str] = set()
    for sub, _ in iter_graphs(body):
        if sub.input or sub.initializer:  # (an If branch has neither: no generators for them)
            names.update(vi.name for vi in sub.input)
            names.update(t.name for t in sub.initializer)
        for x in sub.node[:]:  # (`graph.free_names` says why [:])
            names.update(x.input[:])
            names.update(x.output[:])
    names.discard("")
    return names


def _graph_attribute(a: onnx.AttributeProto, bodies: list[onnx.GraphProto]) -> onnx.AttributeProto:
    new = onnx.AttributeProto(name=a.name, type=a.type, doc_string=a.doc_string)
    if a.type == onnx.AttributeProto.GRAPH:
        new.g.CopyFrom(bodies[0])
    else:
        new.graphs.extend(bodies)
    return new


def function_path(f: onnx.FunctionProto) -> str:
    return f"{f.domain}::{f.name}" + (f":{f.overload}" if f.overload else "")


# ---- types ---------------------------------------------------------------------------------------
class FreshDims:
    """Symbolic dims that name nothing else: `unk__dmlgraph_N` (export writes `unk__` dims as
    unknown), skipping every dim the model itself names so (`taken`, asked on the first `new`: a
    model's own `unk__dmlgraph_0` would otherwise be proved equal to a fresh dim)."""

    def __init__(self, taken: Callable[[], set[str]] = set) -> None:
        self._n = itertools.count()
        self._taken_of = taken
        self._taken: set[str] | None = None

    def new(self) -> str:
        if self._taken is None:
            self._taken = self._taken_of()
        while True:
            name = f"{FRESH_PREFIX}{next(self._n)}"
            if name not in self._taken:
                return name

    def fill(self, shape: tuple | None) -> tuple | None:
        """`shape` with every unknown dim given a fresh name."""
        return None if shape is None else tuple(self.new() if d is None else d for d in shape)


def _fresh_like_dims(g: Graph, bodies: Iterable[onnx.GraphProto] = ()) -> set[str]:
    """The dims named like fresh ones anywhere in the model `g` is the main graph of (its values',
    its bodies' and functions' declarations at any depth), and in `bodies`."""
    dims = {d for v in g.values.values() if v.shape for d in v.shape if isinstance(d, str) and FRESH_PREFIX in d}
    bodies = itertools.chain((b for n in _holders(g) for b in graphs_of(n.attributes)),
                             (b for f in g.info.functions for n in f.node for b in graphs_of(n.attribute)), bodies)
    infos = [vi for body in bodies for sub, _ in iter_graphs(body)
             for vi in itertools.chain(sub.input, sub.output, sub.value_info)]
    infos += [vi for f in g.info.functions for vi in f.value_info]
    return dims | {d.dim_param for vi in infos for d in vi.type.tensor_type.shape.dim if FRESH_PREFIX in d.dim_param}


def _declared(vi: onnx.ValueInfoProto) -> tuple | None:
    return type_shape(vi.type)[1]


def _value_info(name: str, spec: TypeSpec) -> onnx.ValueInfoProto:
    vi = onnx.ValueInfoProto(name=name)
    vi.type.CopyFrom(_tensor_type(*spec))
    return vi


@functools.lru_cache(maxsize=1024)  # (the bodies of a model read values of a few types: each built once)
def _tensor_type(elem_type: int, shape: tuple | None) -> onnx.TypeProto:
    return helper.make_tensor_type_proto(elem_type, None if shape is None else list(shape))


def _state_type(outer: Value | None, declared_in: onnx.ValueInfoProto, declared_out: onnx.ValueInfoProto | None,
                dims: FreshDims, what: str) -> TypeSpec | str:
    """A value carried from one iteration to the next: the initial value's element type; a dim is
    static only where the initial value, the body's declared input and its declared output all give
    the same size (the value may change shape between iterations), else fresh."""
    if outer is None or not outer.elem_type:
        return f"the {what} {declared_in.name!r} has no known type"
    shapes = [outer.shape, _declared(declared_in), None if declared_out is None else _declared(declared_out)]
    rank = {len(s) for s in shapes if s is not None}
    if outer.shape is None or len(rank) != 1:
        return outer.elem_type, None
    given = [s for s in shapes if s is not None]
    known = len(given) == len(shapes)
    return outer.elem_type, tuple(d if known and isinstance(d, int) and all(s[a] == d for s in given) else dims.new()
                                  for a, d in enumerate(outer.shape))


def formal_types(parent: Graph, node: OnnxNode, attr: str, body: onnx.GraphProto,
                 dims: FreshDims) -> list[TypeSpec] | str:
    """The types of a body's formal inputs, from the node that runs it; a reason when they cannot
    be known (or the op's bodies are not lowered)."""
    op = node.op_type if node.domain in STANDARD else f"{node.domain}::{node.op_type}"
    n_in, n_out = len(body.input), len(body.output)
    if op == "If":
        return [] if n_in == 0 else "an If branch takes no inputs, and this one declares some"
    if op == "Loop" and attr == "body":
        carried = len(node.inputs) - 2
        if carried < 0 or n_in != 2 + carried or n_out < 1 + carried:
            return "its inputs and outputs do not match the Loop's"
        types: list[TypeSpec] = [(TensorProto.INT64, ()), (TensorProto.BOOL, ())]
        for i in range(carried):
            t = _state_type(node.inputs[2 + i], body.input[2 + i], body.output[1 + i], dims, "loop-carried value")
            if isinstance(t, str):
                return t
            types.append(t)
        return types
    if op == "Scan" and attr == "body":
        if parent.info.opset_imports.get("", 0) < 9:
            return "Scan before opset 9 (with a batch axis) is not lowered"
        m = node.attr("num_scan_inputs", 0)
        n_state = len(node.inputs) - m
        if m <= 0 or n_state < 0 or n_in != n_state + m or n_out < n_state:
            return "its inputs and outputs do not match the Scan's"
        types = []
        for i in range(n_state):
            t = _state_type(node.inputs[i], body.input[i], body.output[i], dims, "scan state")
            if isinstance(t, str):
                return t
            types.append(t)
        axes = node.attr("scan_input_axes") or [0] * m
        for j in range(m):
            outer = node.inputs[n_state + j]
            if outer is None or not outer.elem_type:
                return f"the scanned input {j} has no known type"
            shape = dims.fill(outer.shape)
            if shape is not None:
                axis = axes[j] + len(shape) if axes[j] < 0 else axes[j]
                shape = shape[:axis] + shape[axis + 1:]
            types.append((outer.elem_type, shape))
        return types
    return f"bodies of {op} are not lowered (If, Loop and Scan bodies are)"


def _body_varying(node: OnnxNode, attr: str, body: onnx.GraphProto, outer: frozenset[str],
                  outer_varying: dict[str, str]) -> dict[str, str]:
    """What changes per iteration in a body: its formal inputs if it is a Loop/Scan body, and what it
    reads of an enclosing body's (an If inside a Loop reading the loop-carried value)."""
    return {name: what for name, what in outer_varying.items() if name in outer} | _varying(node, attr, body)


def _varying(node: OnnxNode, attr: str, body: onnx.GraphProto) -> dict[str, str]:
    """The formal inputs of a Loop or Scan body, which change per iteration, each described."""
    if node.domain not in STANDARD or attr != "body":
        return {}
    names = [vi.name for vi in body.input]
    if node.op_type == "Loop" and len(names) >= 2:
        return {names[0]: "the iteration number", names[1]: "the loop condition"} | \
            {name: "a loop-carried value" for name in names[2:]}
    if node.op_type == "Scan":
        n_state = len(names) - node.attr("num_scan_inputs", 0)
        return {name: "a scan state value" if i < n_state else "a scanned slice" for i, name in enumerate(names)}
    return {}


# ---- bodies as graphs of their own ---------------------------------------------------------------
@dataclass
class Body:
    """A body as a standalone Graph: its formal inputs, then extra inputs for the enclosing values it
    reads (`outer`; the enclosing constants among them are constants of the body instead)."""

    graph: Graph
    outer: frozenset[str]
    copied: frozenset[str] = frozenset()  # values of enclosing cones copied in (`_outer_cones`)


@dataclass
class _Spec:
    """What a body's model is made of: its GraphProto, the inputs (formal ones, then the enclosing
    values it reads), the small enclosing constants shape inference reads, every enclosing constant."""

    proto: onnx.GraphProto
    inputs: list[onnx.ValueInfoProto]
    constants: list[onnx.TensorProto]
    borrowed: dict[str, Value | np.ndarray | DmlNode]
    outer: frozenset[str]
    copied: frozenset[str] = frozenset()


def _body_spec(parent: Graph, node: OnnxNode, attr: str, proto: onnx.GraphProto, dims: FreshDims,
               varying: dict[str, str] | None = None) -> _Spec | str:
    """(`varying`: given when the enclosing cones are copied in, the enclosing values that change per
    iteration, where a copy stops; the executor runs bodies as they are.)"""
    formal = formal_types(parent, node, attr, proto, dims)
    if isinstance(formal, str):
        return formal
    inputs = [_value_info(vi.name, t) for vi, t in zip(proto.input[:], formal)]  # (`graph.free_names` says why [:])
    outer = sorted(free_names(proto))
    prelude, reads = _outer_cones(parent, proto, outer, varying) if varying is not None else ([], outer)
    # The enclosing graph's inputs first, in its order: where two inputs name a dim alike (a claim, not
    # a proof), a size is read from the first input that has it, as in the enclosing graph itself.
    rank = {v.name: i for i, v in enumerate(parent.inputs)}
    reads = sorted(reads, key=lambda name: (rank.get(name, len(rank)), name))
    borrowed: dict[str, Value | np.ndarray | DmlNode] = {}
    constants: list[onnx.TensorProto] = []  # small enclosing constants, which shape inference reads
    for name in reads:
        v = parent.find(name)
        if v is None:
            return f"it reads {name!r}, which no enclosing scope defines"
        if not v.elem_type:
            return f"the enclosing value {name!r} it reads has no known tensor type"
        const = _constant(parent, v)
        if const is not None:
            borrowed[name] = const
            small = _small_tensor(name, const)
            if small is not None:
                constants.append(small)
                continue
        inputs.append(_value_info(name, (v.elem_type, dims.fill(v.shape))))
    if not prelude:
        return _Spec(proto, inputs, constants, borrowed, frozenset(outer))
    copied = frozenset(o for n in prelude for o in n.output)
    full = onnx.GraphProto()
    full.CopyFrom(proto)
    del full.node[:]
    full.node.extend(prelude)
    full.node.extend(proto.node)
    for name in sorted(copied):  # (as the enclosing graph knows them: the inference of a DML node's sizes may not)
        v = parent.values[name]
        if v.elem_type:
            full.value_info.append(_value_info(name, (v.elem_type, _enclosing_dims(v.shape))))
    return _Spec(full, inputs, constants, borrowed, frozenset(outer) | frozenset(reads) | copied, copied)


def _enclosing_dims(shape: tuple | None) -> tuple | None:
    """An enclosing value's shape for a body's model: its dim names kept, but not the `unk__N` of the
    enclosing graph's inference (the body's own inference numbers its own)."""
    if shape is None:
        return None
    return tuple(None if isinstance(d, str) and d.startswith("unk__") and FRESH_PREFIX not in d else d for d in shape)


# The enclosing nodes a body's proof may see: index and shape arithmetic, comparisons, masks (as
# `passes.data_free.INDEX_OPS`), and the band generators the enclosing graph's lowering made.
CONE_OPS = {"Shape", "Size", "Constant", "ConstantOfShape", "Identity", "Range", "Gather", "Slice", "Squeeze",
            "Unsqueeze", "Reshape", "Concat", "Expand", "Cast", "CastLike", "Add", "Sub", "Neg", "Abs", "Min",
            "Max", "Mul", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal", "And", "Or", "Not", "Xor",
            "Where", "Trilu", "EyeLike", "Transpose", "CumSum", "Tile", "Sign", "Clip", "Flatten", "Div", "Split",
            "GatherND"}
CONE_LIMIT = 96  # nodes copied into one body: a mask's cone, not a model


def _outer_cones(parent: Graph, proto: onnx.GraphProto, outer: list[str],
                 varying: dict[str, str]) -> tuple[list[onnx.NodeProto], list[str]]:
    """The enclosing nodes that compute what a body reads (its sizes, index grids, masks), as a
    prelude of the body, and the enclosing values the body with that prelude reads. A body's proof
    and census then see where an outer value comes from (`Shape(x)`, a Range grid, a band) instead
    of an input of unknown content; `write_back` drops the copies again (the enclosing graph still
    computes them). A copy follows the edges back through CONE_OPS and stops at constants, graph
    inputs, values that change per iteration (`varying`: they stay inputs, and `varying_masks`
    declines what reads them), and any other op."""
    chosen: dict[int, Node] = {}
    for name in outer:
        v = parent.values.get(name)
        if v is None or _constant(parent, v) is not None:
            continue
        cone = _cone(parent, v, varying, chosen)
        if cone is not None and len(chosen) + len(cone) <= CONE_LIMIT:
            chosen.update(cone)
    if not chosen:
        return [], outer
    order: list[Node] = []  # (depth first from the reads: producers before consumers)
    done: set[int] = set()

    def visit(n: Node) -> None:
        done.add(n.id)
        for x in n.inputs:
            p = x.producer if x is not None else None
            if p is not None and p.id in chosen and p.id not in done:
                visit(p)
        order.append(n)
    for n in chosen.values():
        if n.id not in done:
            visit(n)
    copied = {v.name for n in order for v in n.outputs}
    own = _graph_names(proto) - set(outer)
    if copied & own or any(not v.name for n in order for v in n.outputs):
        return [], outer
    reads = set(outer) - copied
    for n in order:
        reads.update(x.name for x in n.inputs if x is not None and x.name not in copied)
    nodes = [dml_node_proto(n) if isinstance(n, DmlNode) else onnx_node_proto(cast(OnnxNode, n)) for n in order]
    if reads & own:
        return [], outer
    return nodes, sorted(reads)


def _cone(parent: Graph, v: Value, varying: dict[str, str], chosen: dict[int, Node]) -> dict[int, Node] | None:
    """The copyable nodes behind `v` not in `chosen` yet (None: more than CONE_LIMIT)."""
    found: dict[int, Node] = {}
    stack = [v]
    while stack:
        x = stack.pop()
        p = x.producer
        if p is None or p.id in found or p.id in chosen or x.name in varying or _constant(parent, x) is not None:
            continue
        if isinstance(p, OnnxNode):
            if p.__class__ is not OnnxNode or p.domain not in STANDARD or p.op_type not in CONE_OPS \
                    or p.has_subgraph:
                continue
        elif not isinstance(p, DmlNode) or p.operands[0] is not None:  # (a band generator, not an application)
            continue
        found[p.id] = p
        if len(found) > CONE_LIMIT:
            return None
        stack.extend(i for i in p.inputs if i is not None)
    return found


def _finish(parent: Graph, spec: _Spec, g: Graph) -> Body:
    for name, const in spec.borrowed.items():
        _borrow(g, g.values[name], const)
    g.reserved = EnclosingNames(parent, _subgraph_names(_holders(g)))
    return Body(g, spec.outer, spec.copied)


def build_body(parent: Graph, node: OnnxNode, attr: str, proto: onnx.GraphProto, dims: FreshDims) -> Body | str:
    """The body of `node`'s `attr` as a Graph (or why it cannot be one)."""
    return next(build_bodies(parent, [(node, attr, proto)], dims))


def build_bodies(parent: Graph, bodies: list[tuple[OnnxNode, str, onnx.GraphProto]],
                 dims: FreshDims) -> Iterator[Body | str]:
    """`build_body` of each (node, attribute, body) of `parent`, in order."""
    return built_bodies(parent, [_body_spec(parent, node, attr, proto, dims) for node, attr, proto in bodies])


def built_bodies(parent: Graph, specs: list[_Spec | str]) -> Iterator[Body | str]:
    """The body of each spec (or why it has none), in order: imported together where they can
    share one model (`import_together`), else each when it is asked for (one large body in memory
    at a time)."""
    ready = [s for s in specs if isinstance(s, _Spec)]
    together = import_together(parent.info, ready) if len(ready) > 1 else None
    made = iter(together or ())
    for s in specs:
        if isinstance(s, str):
            yield s
            continue
        yield _finish(parent, s, next(made)) if together else _build_alone(parent, s)


def _build_alone(parent: Graph, s: _Spec) -> Body | str:
    """One body imported alone."""
    g = _import(parent.info, s.proto, s.inputs, parent.info.opset_imports, s.constants)
    return g if isinstance(g, str) else _finish(parent, s, g)


class _Lazy:
    """A value computed when first asked for."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make, self.done, self.value = make, False, None

    def get(self) -> Any:
        if not self.done:
            self.value, self.done = self.make(), True
        return self.value


class EnclosingNames:
    """The names a body must not define: its own nested bodies' (`own`) and every name of the
    enclosing graph, looked up there when asked rather than copied (a copy per body made a graph
    of many If nodes quadratic: 2,000 bodies spent 0.5 s copying the outer names)."""

    def __init__(self, parent: Graph, own: set[str]):
        self.parent = parent
        self.own = own

    def __contains__(self, name: object) -> bool:
        return name in self.own or name in self.parent.values or name in self.parent.reserved

    def __ior__(self, names: set[str]) -> "EnclosingNames":
        self.own |= names
        return self

    def encloses(self, name: str) -> bool:
        """Whether an enclosing scope has a value of that name (what a body's new name must not shadow)."""
        if name in self.parent.values:
            return True
        outer = self.parent.reserved
        return isinstance(outer, EnclosingNames) and outer.encloses(name)


def _constant(g: Graph, v: Value) -> Value | np.ndarray | DmlNode | None:
    """An enclosing constant: the initializer (shared, not copied), a Constant node's tensor, or a
    DML generator of static sizes (a stored mask the enclosing graph lowered: the body gets a copy,
    so its rules can fuse it with what applies it there)."""
    if v.name in g.initializers and v.name not in g.overridable_inputs:
        return g.initializers[v.name]
    p = v.producer
    if isinstance(p, DmlNode) and all(x is None for x in p.inputs) and p.static_shape is not None:
        return p
    if isinstance(p, OnnxNode) and p.op_type == "Constant" and p.domain in STANDARD:
        for a in p.attributes:
            if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                return numpy_helper.to_array(a.t)
    return None


SMALL_CONSTANT = 4096  # elements: an index constant (an axis, a k, a size), not weights


def _small_tensor(name: str, const: Value | np.ndarray | DmlNode) -> onnx.TensorProto | None:
    """An enclosing constant small enough to copy into the model shape inference sees (whose
    Unsqueeze axes or Reshape sizes it then reads), as a TensorProto; None for anything else."""
    if isinstance(const, np.ndarray):
        return numpy_helper.from_array(const, name) if const.size <= SMALL_CONSTANT else None
    if isinstance(const, Value) and const.shape is not None and all(isinstance(d, int) for d in const.shape) \
            and math.prod(cast(tuple[int, ...], const.shape)) <= SMALL_CONSTANT:
        if const.array is not None:
            return numpy_helper.from_array(np.asarray(const.array), name)
        if const.initializer is not None and const.initializer.data_location != TensorProto.EXTERNAL:
            return const.initializer
    return None


def _borrow(g: Graph, v: Value, const: Value | np.ndarray | DmlNode) -> None:
    """Make `v` (an extra input, or a copied small constant) the enclosing constant itself in the
    body (`write_back` leaves it out again)."""
    g.inputs = [x for x in g.inputs if x is not v]
    if isinstance(const, DmlNode):
        copy = DmlNode(const.name, None, None, None, v, elem_type=const.elem_type, value=const.value,
                       begin=const.begin, end=const.end, static_shape=const.static_shape, exact=const.exact,
                       kind=const.kind)
        copy.rule = const.rule
        v.elem_type, v.shape = const.outputs[0].elem_type, const.static_shape
        g.add_node(copy)
        return
    if isinstance(const, Value):
        v.initializer, v.array, v.base_dir = const.initializer, const.array, const.base_dir
        v.elem_type, v.shape = const.elem_type, const.shape
    else:
        v.initializer, v.array, v.shape = None, const, tuple(const.shape)
    g.initializers[v.name] = v


def _model(info: ModelInfo, opsets: dict[str, int], name: str, specs: list[_Spec]) -> onnx.ModelProto:
    """One model holding these bodies with their inputs and constants (an input or constant an
    earlier body has too is not repeated: the enclosing values they share)."""
    model = onnx.ModelProto(ir_version=info.ir_version)
    mg = model.graph
    mg.name = name
    inputs: set[str] = set()
    initializers: set[str] = set()
    for s in specs:
        mg.input.extend(vi for vi in s.inputs if vi.name not in inputs)
        mine = list(itertools.chain(s.proto.initializer, s.constants))
        mg.initializer.extend(t for t in mine if t.name not in initializers)
        inputs.update(vi.name for vi in s.inputs)
        initializers.update(t.name for t in mine)
        mg.output.extend(s.proto.output)
        mg.node.extend(s.proto.node)
        mg.value_info.extend(s.proto.value_info)
    opsets = opsets | {DOMAIN: DOMAIN_VERSION}  # (a lowered body's DML nodes: their schemas type them)
    model.opset_import.extend(helper.make_opsetid(d, v) for d, v in sorted(opsets.items()))
    model.functions.extend(info.functions)
    return model


def _import(info: ModelInfo, proto: onnx.GraphProto, inputs: list[onnx.ValueInfoProto],
            opsets: dict[str, int], constants: list[onnx.TensorProto] | None = None) -> Graph | str:
    """A model whose graph is `proto` with these inputs and extra constants, imported (shape
    inference included)."""
    model = _model(info, opsets, proto.name or "body", [_Spec(proto, inputs, constants or [], {}, frozenset())])
    try:
        g = import_model(model, info.base_dir)
    except DmlgraphError as e:
        return f"it cannot be read as a graph of its own ({e})"
    g.info.source = None  # (a body's formal inputs are typed from its holder: no user declared them)
    return g


class _Inferred(PendingShapes):
    """Shapes inferred already, where the import asks for them."""

    def __init__(self, types: list[ValueType]) -> None:
        super().__init__(onnx.ModelProto())
        self.types = types

    def value_types(self) -> list[ValueType]:
        return self.types


def import_together(info: ModelInfo, specs: list[_Spec]) -> list[Graph] | None:
    """The bodies of one graph imported as one model, then split into one Graph each, as `_import`
    makes them: one shape inference and one import instead of one per body (2,500 If nodes with a
    one-node branch each spent half their lowering importing 5,000 models). None when they cannot
    share a model (a name two of them define, or one defines and another reads; an output or an
    annotation naming an enclosing value; an unnamed output), when its inference may differ from
    each body's own (an error, a value over the data-propagation limit), or when a body is large
    enough that its own import infers in a child, under a deadline: each is imported alone."""
    owner: dict[str, int] = {}
    for i, s in enumerate(specs):
        if len(s.proto.node) >= CHILD_MIN_NODES or any(not o for n in s.proto.node for o in n.output) \
                or any(o.name in s.outer for o in s.proto.output) or any(vi.name in s.outer for vi in s.proto.value_info):
            return None
        for name in _names(s.proto) - s.outer:
            if owner.setdefault(name, i) != i:
                return None
    if any(name in owner for s in specs for name in s.outer):
        return None
    model = _model(info, info.opset_imports, "bodies", specs)
    types = whole_value_types(model)
    if types is None:
        return None
    whole = Graph(ModelInfo(ir_version=model.ir_version, opset_imports={o.domain or "": o.version for o in model.opset_import},
                            functions=list(model.functions), base_dir=info.base_dir))  # (as `import_model`)
    try:
        build_graph(whole, model, _Inferred(types), info.base_dir)
    except DmlgraphError:
        return None
    nodes = iter(list(whole.nodes.values()))  # (one per NodeProto, in order)
    return [_split(whole, s, [next(nodes) for _ in s.proto.node]) for s in specs]


def _names(proto: onnx.GraphProto) -> set[str]:
    """Every name a body and its own bodies use."""
    names = _graph_names(proto) | {o.name for o in proto.output} | {vi.name for vi in proto.value_info}
    names.discard("")
    return names


def _split(whole: Graph, s: _Spec, nodes: list[Node]) -> Graph:
    """Body `s`'s Graph out of `whole`: its nodes and values, and a copy of each enclosing value it
    reads (so that the uses of one are its own), in the order `_import` would make them."""
    g = Graph(replace(whole.info, graph_name=s.proto.name or "body", functions=list(whole.info.functions), source=None))
    values = g.values
    initializers = [t.name for t in itertools.chain(s.proto.initializer, s.constants)]
    names = initializers + [vi.name for vi in s.inputs]
    for n in nodes:
        names += [v.name for v in itertools.chain(n.inputs, n.outputs) if v is not None]
    names += [o.name for o in s.proto.output] + [vi.name for vi in s.proto.value_info]
    for name in names:
        if name not in values:
            v = whole.values[name]
            if name in s.outer and name not in s.copied:
                copy = Value(name, v.elem_type, v.shape)
                copy.initializer, copy.array, copy.base_dir = v.initializer, v.array, v.base_dir
                v = copy
            values[name] = v
    for n in nodes:
        n.inputs = [None if v is None else values[v.name] for v in n.inputs]
        for b in n.bodies.values() if n.__class__ is OnnxNode else ():  # (what its bodies read: the same)
            for name, x in b.free_values().items():
                if values.get(name, x) is not x:
                    rewire_body(b, x, values[name])
        g.add_node(n)
    g.initializers = {name: values[name] for name in initializers}
    g.inputs = [values[vi.name] for vi in s.inputs if vi.name not in g.initializers]
    g.overridable_inputs = [vi.name for vi in s.inputs if vi.name in g.initializers]
    g.outputs = [values[o.name] for o in s.proto.output]
    g.value_info_names = dict.fromkeys(vi.name for vi in s.proto.value_info)
    return g


def write_back(body: Body, proto: onnx.GraphProto) -> onnx.GraphProto:
    """The lowered body as a GraphProto for the same attribute: `proto`'s formal inputs, no extra
    inputs, no enclosing constants (edited in the exported graph rather than copied out of it: a
    copy per field was a third of the write-back of a small body)."""
    return _as_body(export_model(body.graph, "dml").graph, body, proto)


def write_back_portable(body: Body, proto: onnx.GraphProto, exact_only: bool) -> onnx.GraphProto | None:
    """The lowered body as the portable target writes it, from the typed copy the rules ran on:
    the same proofs as the main graph's export (a k computed from sizes needs no Clip, a static
    size no Shape), its new constants initializers of the body (ONNX and onnxruntime allow them;
    a Constant node each was a node more)."""
    new = _as_body(export_model(body.graph, "onnx", exact_only, body=True).graph, body, proto)
    _drop_dead(new)
    return new


def _drop_dead(g: onnx.GraphProto) -> None:
    """Delete the nodes nothing reads (the portable nodes of a copied enclosing generator, whose
    last node `_as_body` dropped)."""
    live = {vi.name for vi in g.output}
    dead = []
    for i in reversed(range(len(g.node))):
        n = g.node[i]
        if not any(o in live for o in n.output):
            dead.append(i)
            continue
        live.update(n.input)
        for b in graphs_of(n.attribute):
            live |= free_names(b)
    for i in dead:  # (descending)
        del g.node[i]


def _read_names(g: onnx.GraphProto) -> set[str]:
    """The names a graph's nodes (their bodies included) and outputs read."""
    read = {vi.name for vi in g.output}
    for n in g.node:
        read.update(n.input)
        for b in graphs_of(n.attribute):
            read |= free_names(b)
    return read


def _as_body(new: onnx.GraphProto, body: Body, proto: onnx.GraphProto) -> onnx.GraphProto:
    """An exported body's graph edited into the body of `proto`'s attribute (`write_back`)."""
    outer = body.outer
    new.name = proto.name
    new.doc_string = proto.doc_string
    del new.input[:]
    new.input.extend(proto.input)
    declared = {vi.name: vi for vi in proto.output}
    for i, vi in enumerate(new.output):
        if vi.name in declared:
            new.output[i].CopyFrom(declared[vi.name])
    _drop(new.initializer, lambda t: t.name in outer)
    new.sparse_initializer.extend(proto.sparse_initializer)
    _drop(new.value_info, lambda vi: vi.name in outer)
    _drop(new.node, lambda n: all(o in outer for o in n.output))  # (copied generators)
    new.quantization_annotation.extend(proto.quantization_annotation)
    new.metadata_props.extend(proto.metadata_props)
    return new


def _drop(items: Any, gone: Callable[[Any], bool]) -> None:
    """Delete the items of a repeated proto field that are `gone`, keeping the others' order."""
    for i in reversed([i for i, x in enumerate(items) if gone(x)]):
        del items[i]


def execution_body(parent: Graph, node: OnnxNode, attr: str) -> Graph:
    """`node`'s body Graph under `attr`, its values typed as a lowering types them (the executor
    runs bodies holding DML nodes: a zero-trip Loop's outputs take the body's types)."""
    body = node.bodies.get(attr)
    if body is None or body.source is None:
        raise DmlgraphError(f"cannot run the {attr} of {node.op_type} node {node.name!r}: it is not a body")
    proto = body.source
    typed = build_body(parent, node, attr, proto, FreshDims(lambda: _fresh_like_dims(parent, [proto])))
    if isinstance(typed, str):
        raise DmlgraphError(f"cannot run the {attr} of {node.op_type} node {node.name!r}: {typed}")
    for name, v in body.values.items():
        t = typed.graph.values.get(name)
        if t is not None and t.elem_type:
            v.elem_type, v.shape = t.elem_type, t.shape
    return body


# ---- model-local functions -----------------------------------------------------------------------
def function_key(f: onnx.FunctionProto) -> FunctionKey:
    return f.domain, f.name, f.overload


class _CallSites:
    """The input types each local function is called with, and why some calls have none."""

    def __init__(self, functions: list[onnx.FunctionProto], dims: FreshDims) -> None:
        self.keys = {function_key(f) for f in functions}
        self.dims = dims
        self.sites: dict[FunctionKey, list[list[TypeSpec | None]]] = {}
        self.reasons: dict[FunctionKey, str] = {}
        self.kinds: Kinds | None = None  # (census only) what a call's arguments are in its graph
        self.arg_kinds: dict[FunctionKey, list[list[str | None]]] = {}
        # per call: the caller's ONNX opset, each argument's `_argument_cones`, the leaves they read
        self.cones: dict[FunctionKey, list[tuple[int, list[Cone | None], list[Leaf]]]] = {}
        self.total: collections.Counter = collections.Counter()  # calls in the model (`call_leaves.count_calls`)

    def record(self, g: Graph, hints: dict[str, str] | None = None) -> None:
        if not self.keys:
            return
        kinds = _Lazy(lambda: self.kinds(g, hints or {}) if self.kinds else {})
        for n in g.nodes.values():
            if n.__class__ is OnnxNode and n.domain not in STANDARD and call_key(n) in self.keys:
                self.sites.setdefault(call_key(n), []).append(
                    [(v.elem_type, v.shape) if v is not None and v.elem_type else None for v in n.inputs])
                if self.kinds:
                    self.arg_kinds.setdefault(call_key(n), []).append(
                        [None if v is None else kinds.get().get(v.name) for v in n.inputs])

    def hints(self, f: onnx.FunctionProto) -> dict[str, str]:
        """The function's inputs that every call passes the same kind of (a size, an index grid, a
        mask), for its census."""
        calls = self.arg_kinds.get(function_key(f), [])
        return {name: kind for i, name in enumerate(f.input) if calls
                and len({c[i] if i < len(c) else None for c in calls}) == 1 and (kind := calls[0][i]) is not None}

    def cones_of(self, traced: list[tuple[FunctionKey, int, list[Cone | None], list[Leaf]]]) -> None:
        for key, opset, cones, leaves in traced:
            self.cones.setdefault(key, []).append((opset, cones, leaves))

    def definitions(self, f: onnx.FunctionProto, opset: int) -> tuple[list[tuple[int, Cone]], list[Leaf]]:
        """The formal inputs every call computes alike from its other arguments and constants (the
        same cone, under the function's `opset`: its nodes are copied in), each with that cone,
        every one after those its cone reads; and the leaves the cones read (`call_leaves`): the
        same main-graph inputs at every call, each typed as all calls agree. A cone reading a leaf
        defines its formal only where every call of the model was traced and passes the same leaves."""
        made = self.cones.get(function_key(f), [])
        calls = [c for _, c, _ in made]
        if not calls or any(len(c) != len(f.input) for c in calls) or any(o != opset for o, _, _ in made):
            return [], []
        leaves = _agreed_leaves([ls for _, _, ls in made], self.dims) \
            if len(made) == self.total[function_key(f)] else None
        agreed = {i: c for i, c in enumerate(calls[0]) if c is not None and all(other[i] == c for other in calls)
                  and (leaves is not None or not _cone_leaves(c))}
        order: list[tuple[int, Cone]] = []
        while agreed:  # (a cone reading a formal that is defined after it, or in a cycle, defines nothing)
            ready = [i for i, c in agreed.items() if not (_cone_reads(c) & agreed.keys())]
            if not ready:
                break
            order += [(i, agreed.pop(i)) for i in ready]
        return order, leaves or []

    def untyped(self, proto: onnx.GraphProto, reason: str) -> None:
        for sub, _ in iter_graphs(proto):
            self.untyped_nodes(sub.node, reason)

    def untyped_nodes(self, nodes: Iterable[onnx.NodeProto], reason: str) -> None:
        for n in nodes:
            key = proto_call_key(n)
            if key in self.keys:
                self.reasons.setdefault(key, reason)
            for body in graphs_of(n.attribute):
                self.untyped(body, reason)

    def types(self, f: onnx.FunctionProto) -> list[TypeSpec] | str:
        """One type per input that every call agrees with: element types equal, a dim static where
        every call gives it the same size or name, else fresh (any size)."""
        key = function_key(f)
        if key in self.reasons:
            return self.reasons[key]
        calls = self.sites.get(key)
        if not calls:
            return "it is never called, so its input types are unknown"
        types: list[TypeSpec] = []
        for i, name in enumerate(f.input):
            given = [c[i] if i < len(c) else None for c in calls]
            specs = [s for s in given if s is not None]
            if len(specs) != len(given):
                return f"a call gives its input {name!r} no value of a known type"
            if len({s[0] for s in specs}) != 1:
                return f"its calls give input {name!r} different element types"
            shapes = [s[1] for s in specs if s[1] is not None]
            if len(shapes) != len(specs) or len({len(s) for s in shapes}) != 1:
                types.append((specs[0][0], None))
                continue
            types.append((specs[0][0], tuple(
                dims[0] if dims[0] is not None and all(d == dims[0] for d in dims) else self.dims.new()
                for dims in zip(*shapes))))
        return types


# A formal input as its call computes it: (how the formal is read: ("arg", j) another argument of the
# call, ("const", dtype, shape, bytes), ("node", k, output)), then the cone's nodes in order, each
# (op_type, its attributes' bytes, its inputs as such references, its number of outputs).
Cone = tuple[tuple, tuple]
Prelude = tuple[list[onnx.NodeProto], frozenset[str], frozenset[str]]  # nodes, the names they make, the formals
PRELUDE_PREFIX = "dmlgraph_call_"  # the names of a prelude's values (others' skipped)


Leaf = tuple[str, TypeSpec]  # a main-graph input a cone reads the Shape of, as a call's graph types it


def _agreed_leaves(calls: list[list[Leaf]], dims: FreshDims) -> list[Leaf] | None:
    """The leaves every call reads (the same names in the same order), each typed as they agree
    (None: they differ, or their element types do)."""
    first = calls[0]
    if any([name for name, _ in c] != [name for name, _ in first] for c in calls):
        return None
    merged: list[Leaf] = []
    for k, (name, _) in enumerate(first):
        specs = [c[k][1] for c in calls]
        shapes = [s for _, s in specs]
        if len({t for t, _ in specs}) != 1:
            return None
        if any(s is None for s in shapes) or len({len(s) for s in shapes if s is not None}) != 1:
            merged.append((name, (specs[0][0], None)))
            continue
        merged.append((name, (specs[0][0], tuple(
            ds[0] if ds[0] is not None and all(d == ds[0] for d in ds) else dims.new()
            for ds in zip(*cast(list[tuple], shapes))))))
    return merged


def _cone_leaves(c: Cone) -> set[int]:
    """The leaves a cone reads."""
    return {r[1] for n in c[1] for r in n[2] if r[0] == "leaf"}


class _Undefined(Exception):
    """An argument whose cone reads something else than the call's arguments and constants."""


def _traced(g: Graph, functions: list[onnx.FunctionProto], visible: frozenset[str] = frozenset()
            ) -> list[tuple[FunctionKey, int, list[Cone | None], list[Leaf]]]:
    """Each call of a local function in `g`: its key, `g`'s ONNX opset, its `_argument_cones` and
    their leaves (`visible`: the main-graph inputs a call here may pass). Taken before the rules run
    on `g` (the cones are the caller's own nodes, not what it lowered them to)."""
    if not functions:
        return []
    keys = {function_key(f) for f in functions}
    return [(call_key(n), g.info.opset_imports.get("", 0), *_argument_cones(g, n, visible)) for n in g.nodes.values()
            if n.__class__ is OnnxNode and n.domain not in STANDARD and call_key(n) in keys]


def _argument_cones(g: Graph, call: OnnxNode, visible: frozenset[str] = frozenset()
                    ) -> tuple[list[Cone | None], list[Leaf]]:
    """Each argument of `call` as a cone (`Cone`) over the call's other arguments and constants,
    through CONE_OPS (None: it reads a value that is not passed, or is one): a call passing `x` and
    `Gather(Shape(x), 2)` defines the second formal from the first. A value an argument is the
    Identity of counts as that argument (`Shape(x)` where `Identity(x)` is passed). The Shape of a
    `visible` input of `g` that is not passed reads a leaf (`call_leaves`): ("leaf", k), the k-th of
    the call's leaves (returned, in the order the cones first read them)."""
    args: dict[str, int] = {}
    for j, v in enumerate(call.inputs):
        x = v
        while x is not None and x.name not in args:
            args[x.name] = j
            p = x.producer
            x = p.inputs[0] if isinstance(p, OnnxNode) and p.op_type == "Identity" and p.domain in STANDARD \
                and p.inputs else None
    leaves: list[Leaf] = []
    cones = [None if v is None else _argument_cone(g, v, i, args, leaves, visible) for i, v in enumerate(call.inputs)]
    return cones, leaves


def _argument_cone(g: Graph, v: Value, i: int, args: dict[str, int], leaves: list[Leaf],
                   visible: frozenset[str]) -> Cone | None:
    nodes: list[tuple] = []
    index: dict[int, int] = {}
    kept = len(leaves)

    def leaf(x: Value | None) -> tuple | None:
        if x is None or x.name not in visible or x.name in args or x.producer is not None or not x.elem_type:
            return None
        names = [name for name, _ in leaves]
        if x.name not in names:
            leaves.append((x.name, (x.elem_type, x.shape)))
            names.append(x.name)
        return ("leaf", names.index(x.name))

    def ref(x: Value | None, top: bool = False) -> tuple:
        if x is None:
            return ("none",)
        j = args.get(x.name)
        if j is not None and not (top and j == i):
            if j == i:
                raise _Undefined  # (it reads itself)
            return ("arg", j)
        const = _constant(g, x)
        if const is not None:
            small = None if isinstance(const, DmlNode) else _small_tensor(x.name, const)
            if small is None or small.data_type == TensorProto.STRING:
                raise _Undefined
            a = numpy_helper.to_array(small)
            return ("const", a.dtype.str, a.shape, a.tobytes())
        p = x.producer
        if p is None or p.__class__ is not OnnxNode or p.domain not in STANDARD or p.op_type not in CONE_OPS:
            raise _Undefined
        n = p
        if n.has_subgraph:
            raise _Undefined
        out = next(k for k, o in enumerate(n.outputs) if o is x)
        if n.id not in index:
            shape_of = n.op_type == "Shape" and n.inputs and leaf(n.inputs[0])
            inputs = (shape_of, *(ref(y) for y in n.inputs[1:])) if shape_of else tuple(ref(y) for y in n.inputs)
            attrs = tuple(sorted(a.SerializeToString(deterministic=True) for a in n.attributes))
            nodes.append((n.op_type, attrs, inputs, len(n.outputs)))
            index[n.id] = len(nodes) - 1
            if len(nodes) > CONE_LIMIT:
                raise _Undefined
        return ("node", index[n.id], out)
    try:
        top = ref(v, True)
    except _Undefined:
        del leaves[kept:]
        return None
    return top, tuple(nodes)


def _cone_reads(c: Cone) -> set[int]:
    """The formal inputs a cone reads."""
    refs = [c[0], *(r for n in c[1] for r in n[2])]
    return {r[1] for r in refs if r[0] == "arg"}


def _prelude(f: onnx.FunctionProto, definitions: list[tuple[int, Cone]], leaves: Sequence[Leaf] = ()
             ) -> tuple[Prelude, list[tuple[str, TypeSpec, str]]]:
    """The nodes that compute the formal inputs the calls define (`_CallSites.definitions`) from the
    other formals, constants and `leaves`, each formal under its own name, the rest under fresh ones
    (a node two cones share made once); and the new formals the leaves read become (fresh name,
    type, the calls' leaf)."""
    if not definitions:
        return ([], frozenset(), frozenset()), []
    taken = set(f.input) | set(f.output) | {vi.name for vi in f.value_info}
    for n in all_nodes(f.node):
        taken.update(n.input)
        taken.update(n.output)
        for body in graphs_of(n.attribute):
            taken |= _graph_names(body)
    counter = itertools.count()

    def fresh() -> str:
        while (name := f"{PRELUDE_PREFIX}{next(counter)}") in taken:
            pass
        return name
    nodes: list[onnx.NodeProto] = []
    made: dict[tuple, list[str]] = {}
    added: dict[int, str] = {}

    def name_of(r: tuple, names: list[list[str]]) -> str:
        if r[0] == "none":
            return ""
        if r[0] == "arg":
            return f.input[r[1]]
        if r[0] == "leaf":
            if r[1] not in added:
                added[r[1]] = fresh()
            return added[r[1]]
        if r[0] == "node":
            return names[r[1]][r[2]]
        if r not in made:
            made[r] = [fresh()]
            nodes.append(_constant_node(r, made[r][0]))
        return made[r][0]
    for i, (top, entries) in definitions:
        formal = f.input[i]
        names: list[list[str]] = []
        for k, (op, attrs, inputs, n_out) in enumerate(entries):
            key = (op, attrs, tuple(name_of(r, names) for r in inputs), n_out)
            if key not in made:
                outs = [formal if top[0] == "node" and top[1:] == (k, o) else fresh() for o in range(n_out)]
                node = onnx.NodeProto(op_type=op, input=key[2], output=outs)
                node.attribute.extend(onnx.AttributeProto.FromString(a) for a in attrs)
                nodes.append(node)
                made[key] = outs
            names.append(made[key])
        if top[0] == "const":
            nodes.append(_constant_node(top, formal))
        elif top[0] == "arg" or name_of(top, names) != formal:
            nodes.append(onnx.NodeProto(op_type="Identity", input=[name_of(top, names)], output=[formal]))
    prelude = nodes, frozenset(o for n in nodes for o in n.output), frozenset(f.input[i] for i, _ in definitions)
    return prelude, [(name, leaves[k][1], leaves[k][0]) for k, name in sorted(added.items())]


def _constant_node(r: tuple, name: str) -> onnx.NodeProto:
    _, dtype, shape, data = r
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(
        np.frombuffer(data, np.dtype(dtype)).reshape(shape), name))


def _without_prelude(nodes: list[onnx.NodeProto], outputs: list[str], defined: frozenset[str]) -> list[onnx.NodeProto]:
    """`nodes` (in order) without those computing a formal input (`write_back_function`) and those
    no other node nor the outputs read then (the prelude's, and what a rewrite of a prelude value
    made: the Graph held no dead node before)."""
    live = set(outputs)
    kept: list[onnx.NodeProto] = []
    for n in reversed(nodes):
        if not any(o in live and o not in defined for o in n.output):
            continue
        if any(o in defined for o in n.output):  # (a node another node reads another output of)
            copy = onnx.NodeProto()
            copy.CopyFrom(n)
            for k, o in enumerate(copy.output):
                if o in defined:
                    copy.output[k] = _unused_name(o, nodes)
            n = copy
        kept.append(n)
        live.update(n.input)
        for body in graphs_of(n.attribute):
            live |= free_names(body)
    return kept[::-1]


def _unused_name(base: str, nodes: list[onnx.NodeProto]) -> str:
    names = {x for n in nodes for x in itertools.chain(n.input, n.output)}
    while (base := f"{base}_") in names:
        pass
    return base


def _call_order(functions: list[onnx.FunctionProto]) -> list[int] | str:
    """Function indices, every caller before the functions it calls."""
    index = {function_key(f): i for i, f in enumerate(functions)}
    import networkx as nx  # only models with local functions need it (0.15 s to import)

    calls = nx.DiGraph()
    calls.add_nodes_from(range(len(functions)))
    for i, f in enumerate(functions):
        for n in all_nodes(f.node):
            j = index.get(proto_call_key(n))
            if j is not None:
                calls.add_edge(i, j)
    try:
        return list(nx.lexicographical_topological_sort(calls))
    except nx.NetworkXUnfeasible:
        return "the model's local functions call each other in a cycle, which ONNX does not allow"


def all_nodes(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    """NodeProtos and the nodes of their bodies, at any depth."""
    for n in nodes:
        yield n
        for body in graphs_of(n.attribute):
            yield from all_nodes(body.node)


def _attribute_reason(f: onnx.FunctionProto) -> str | None:
    refs = sorted({a.ref_attr_name for n in all_nodes(f.node) for a in n.attribute if a.ref_attr_name})
    if refs:
        return f"its nodes take the caller's attributes ({', '.join(refs)}), which may differ per call"
    return None


def build_function(info: ModelInfo, f: onnx.FunctionProto, types: list[TypeSpec], dims: FreshDims,
                   prelude: Prelude = ([], frozenset(), frozenset()),
                   added: Sequence[tuple[str, TypeSpec, str]] = ()) -> Graph | str:
    """A function body as a Graph whose inputs have `types`; the formal inputs its calls define
    (`prelude`, `_prelude`) are computed from the others (and the leaf formals `added`, inputs after
    them) instead of being inputs."""
    nodes, _, defined = prelude
    proto = onnx.GraphProto(name=f.name)
    proto.node.extend(nodes)
    proto.node.extend(f.node)
    proto.output.extend(onnx.ValueInfoProto(name=o) for o in f.output)
    proto.value_info.extend(f.value_info)
    opsets = dict(info.opset_imports) | {o.domain: o.version for o in f.opset_import}
    inputs = [_value_info(name, t) for name, t in zip(f.input, types) if name not in defined]
    g = _import(info, proto, inputs + [_value_info(name, t) for name, t, _ in added], opsets)
    if not isinstance(g, str):
        g.reserved = _subgraph_names(_holders(g))
    return g


def write_back_function(g: Graph, f: onnx.FunctionProto, defined: frozenset[str] = frozenset()) -> onnx.FunctionProto:
    """The lowered function: same signature; constants the rules made become Constant nodes (a
    function has no initializers). Where a prelude defined formal inputs (`defined`), what still
    computes one goes (the formal holds that value: its calls proved it), the prelude nodes the others
    read stay (they read only formals and constants), the rest goes."""
    exported = export_model(g, "dml").graph
    new = onnx.FunctionProto()
    new.CopyFrom(f)
    del new.node[:], new.output[:], new.value_info[:]
    nodes = [helper.make_node("Constant", [], [t.name], value=t) for t in exported.initializer]
    nodes += exported.node
    if defined:
        nodes = _without_prelude(nodes, [vi.name for vi in exported.output], defined)
        produced = {o for n in nodes for o in n.output}
        _drop(exported.value_info, lambda vi: vi.name in defined or vi.name not in produced)
    new.node.extend(nodes)
    new.output.extend(vi.name for vi in exported.output)
    new.value_info.extend(exported.value_info)
    if has_dml_nodes(new.node) and all(o.domain != DOMAIN for o in new.opset_import):
        new.opset_import.append(helper.make_opsetid(DOMAIN, DOMAIN_VERSION))
    return new


def execution_function(parent: Graph, node: OnnxNode) -> Graph:
    """The function `node` calls, as a Graph typed by this call (the executor runs functions
    holding DML nodes)."""
    f = next((f for f in parent.info.functions if function_key(f) == call_key(node)), None)
    if f is None:
        raise DmlgraphError(f"node {node.name!r} calls {node.domain}::{node.op_type}, which the model does not define")
    dims = FreshDims(lambda: _fresh_like_dims(parent))
    types = [(v.elem_type, dims.fill(v.shape)) if v is not None and v.elem_type else None for v in node.inputs]
    reason = _attribute_reason(f) or (None if len(types) == len(f.input) and None not in types
                                      else "its inputs' types are unknown")
    g = reason or build_function(parent.info, f, cast(list[TypeSpec], types), dims)  # reason: no None in types
    if isinstance(g, str):
        raise DmlgraphError(f"cannot run function {function_path(f)} called by {node.name!r}: {g}")
    return g
