"""Masks inside If/Loop/Scan bodies and model-local functions, lowered in place: the walk.

The rules run on each body Graph itself, after the graph that holds it and before its own bodies: its
values typed as its import alone types them, the enclosing values it reads seen through their edges,
then it is written back under the same attribute. A body that repeats another reuses one lowering of
a typed copy (`body_reuse`); a model-local function is lowered as a typed copy. What cannot be typed
is declined with the reason (docs/internals.md).
"""
from __future__ import annotations

import collections
from dataclasses import replace
from typing import Callable, cast

import onnx

from dmlgraph.io.onnx_io import DOMAIN, graphs_of, set_bodies
from dmlgraph.ir.graph import DmlNode, Graph, Node, OnnxNode, free_names, rewire_body
from dmlgraph.rewrite import Match, PassResult, body_reuse, call_leaves
from dmlgraph.rewrite.nested.bodies import Body, BodySpec, body_spec, build_alone, built_bodies, finish_body, import_body
from dmlgraph.rewrite.nested.body_types import FreshDims, TypeSpec, fresh_like_dims
from dmlgraph.rewrite.nested.enclosing import EnclosingNames
from dmlgraph.rewrite.nested.functions import (
    CallSites,
    Prelude,
    attribute_reason,
    build_function,
    call_order,
    call_prelude,
    function_key,
    function_path,
    traced_calls,
    write_back_function,
)
from dmlgraph.rewrite.nested.scopes import (
    LOWERED,
    SCOPE,
    Kinds,
    Lazy,
    Scope,
    all_nodes,
    body_path,
    body_varying,
    holder_nodes,
    scopes,
    subgraph_names,
)
from dmlgraph.rewrite.nested.write_back import drop_items, graph_attribute, read_names, write_back, write_back_portable

Written = body_reuse.Written
FlatPasses = Callable[[Graph], PassResult]  # the ordinary passes on one graph
Explain = Callable[[Graph, dict[str, str]], list[Match]]  # declines for masks reading varying values
# The mask census of a body: given its graph before the passes and what its inputs are outside (a
# size, an index grid, a mask: `Kinds` of the enclosing graph), what turns the graph after them and
# their result into rows (`dmlgraph.mask_census.body_census`, `kinds`; the census lives above this layer).
Census = Callable[[Graph, dict[str, str]], Callable[[Graph, PassResult], list[dict]]]


def optimize_nested(g: Graph, flat: FlatPasses, explain: Explain, census: Census | None = None,
                    kinds: Kinds | None = None, portable: bool | None = None, reuse: bool = True) -> PassResult:
    """`flat` on `g`, then on every If/Loop/Scan body and model-local function, written back in
    place; one PassResult for all of them. `census`: take the mask census of each body and function
    too (its rows, each with its `scope`, in `PassResult.census`; the main graph's is the caller's).
    `portable`: the export writes the portable target (with this `exact_only`): each lowered body's
    portable form is written too, from the graph the rules ran on (`Graph.portable`).
    `reuse`: lower a body as another's template renamed (`body_reuse`); off where the rules decline
    sites by their names (`Options.declined_sites`), which a template in tokens does not have."""
    holders = holder_nodes(g)
    if not holders and not g.info.functions:
        return flat(g)  # (nearly every model: no bodies, no functions)
    g.reserved |= subgraph_names(g)
    visible = frozenset(v.name for v in g.inputs) if g.info.functions else frozenset()
    traced = traced_calls(g, g.info.functions, visible)  # (the calls' arguments as the graph computes them before the rules)
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
        self.dims = FreshDims(lambda: fresh_like_dims(main_graph))
        self.calls = CallSites(functions, self.dims)
        self.templates: dict[tuple, body_reuse.Template | None] = {}  # None: that key is lowered body by body
        self.memo: dict = {}  # `body_reuse.key`'s, for one optimize
        self.sightings: collections.Counter = collections.Counter()  # key -> bodies seen with it
        self.superseded = list(main.superseded)
        self.census: Census | None = None
        self.parent_kinds = Lazy(dict)  # the `Kinds` of the graph whose bodies are being lowered
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
        found: list[tuple[OnnxNode, int, list[Scope]]] = []  # (holder, attribute index, its bodies)
        for sc in scopes(parent, scope, varying, recursive=False):
            if found and found[-1][0] is sc.holder and found[-1][1] == sc.index:
                found[-1][2].append(sc)
            else:
                found.append((sc.holder, sc.index, [sc]))
        each = [(node, node.attributes[i].name, sc.proto) for node, i, bodies in found for sc in bodies]
        specs = [body_spec(parent, node, attr, proto, self.dims, varying or {}) for node, attr, proto in each]
        keys = [self._key(parent, node, attr, proto, s, varying or {}) if isinstance(s, BodySpec) and self.reuse else None
                for (node, attr, proto), s in zip(each, specs)]
        self.sightings.update(k[0] for k in keys if k is not None)
        reused = [k is not None and self.sightings[k[0]] > 1 for k in keys]
        built = built_bodies(parent, [s for s, r in zip(specs, reused) if not r])
        kinds = Lazy(lambda: self.calls.kinds(parent, self.hints_of.get(id(parent), {})) if self.calls.kinds else {})
        plan = iter(zip(specs, keys, reused))
        touched: dict[OnnxNode, list[onnx.AttributeProto]] = {}
        forms: dict[OnnxNode, dict[str, onnx.GraphProto]] = {}  # the lowered bodies' portable forms
        for node, i, bodies in found:
            a = node.attributes[i]
            new = []
            for sc in bodies:
                spec, k, r = next(plan)
                label, body, path = sc.label, sc.proto, sc.path
                self.parent_kinds = kinds  # (a nested lower_bodies sets its own)
                done = self._reuse(parent, node, a.name, spec, k, path, varying or {}) if r else None
                if done is None:
                    made = next(built) if not r else build_alone(parent, cast(BodySpec, spec))
                    done = (self._lower_body(parent, node, a.name, label, body, made, scope, varying or {}),)
                new.append(done[0])
            if any(b is not None for b in new):
                kept = [b[0] if b is not None else old.proto for b, old in zip(new, bodies)]
                touched.setdefault(node, list(node.attributes))[i] = graph_attribute(a, kept)
                if a.type == onnx.AttributeProto.GRAPH and new[0] is not None and new[0][1] is not None:
                    forms.setdefault(node, {})[a.name] = new[0][1]
        for node, attributes in touched.items():
            set_bodies(parent, node, attributes)  # (its outer reads may have changed: remove_dead looks again)
            for name, form in forms.get(node, {}).items():
                b = node.bodies[name]
                b.portable = (cast(onnx.GraphProto, b.source), form)
        return bool(touched)

    def _key(self, parent: Graph, node: OnnxNode, attr: str, proto: onnx.GraphProto, s: BodySpec,
             outer_varying: dict[str, str]) -> tuple | None:
        """The body's `body_reuse.key`, and what its template is built from."""
        context = (node.op_type, node.domain, attr, parent.info.ir_version,
                   tuple(sorted(parent.info.opset_imports.items())))
        varying = body_varying(node, attr, proto, s.outer, outer_varying)
        return body_reuse.key(s.proto, s.inputs, s.constants, s.borrowed, s.outer, varying, context, self.calls.keys,
                              self.memo)

    def _reuse(self, parent: Graph, node: OnnxNode, attr: str, spec: BodySpec | str, k: tuple | None, path: str,
               outer_varying: dict[str, str]) -> tuple[Written | None] | None:
        """The body lowered as its key's template renamed (a 1-tuple of what `_lower_body` returns), or
        None when it is to be lowered itself."""
        assert isinstance(spec, BodySpec) and k is not None  # (a body with a key)
        key, c, cproto = k
        if key not in self.templates:
            cspec = BodySpec(cproto, [body_reuse.canonical_input(vi, c) for vi in spec.inputs],
                          [body_reuse.canonical_tensor(t, c) for t in spec.constants],
                          {c.to_token(name): body_reuse.canonical_constant(const, c) for name, const in spec.borrowed.items()},
                          frozenset(map(c.to_token, spec.outer)), frozenset(map(c.to_token, spec.copied)))
            cvarying = {c.to_token(name): what for name, what in body_varying(node, attr, spec.proto, spec.outer,
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

    def _template(self, parent: Graph, cspec: BodySpec, c: body_reuse.Canonical, varying: dict[str, str],
                  rows: list[dict], hints: dict[str, str]) -> body_reuse.Template | None:
        """The lowering of a body in tokens (None: its bodies are lowered each as usual)."""
        g = import_body(parent.info, cspec.proto, cspec.inputs, parent.info.opset_imports, cspec.constants)
        if isinstance(g, str) or body_reuse.has_invented_dims(g):
            return None
        body = finish_body(parent, cspec, g)

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
        path = body_path(scope, node, label)
        if isinstance(body, str):
            self._decline(scope.rstrip("/"), "nested_body", [node], f"its {label} is not lowered: {body}")
            self.calls.untyped(proto, f"it is called in {path}, which is not lowered")
            return None
        g, source = _scope_graph(parent, node, attr, body)
        hints = self.hints_of[id(g)] = self._hints([v.name for v in body.graph.inputs] + sorted(g.free_values()),
                                                   body.outer)
        finish = self.census(g, hints) if self.census else None
        self.calls.cones_of(traced_calls(g, g.info.functions, self.visible))
        result = self.flat(g)
        _keep_enclosing(g, result)
        g.remove_dead()
        self._add(path, result, g)
        varying = body_varying(node, attr, proto, body.outer, outer_varying)
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
            g.source = source
            return None
        g.remove_dead()
        return self._write_back(body if g is body.graph else Body(g, frozenset()), proto)

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
            kept = {t.name for t in written.initializer} | read_names(form)
            drop_items(form.initializer, lambda t: t.name not in kept)
        return written, form

    # -- model-local functions
    def lower_functions(self, main: Graph) -> None:
        """Lower each function with the input types its call sites agree on, callers first."""
        functions = main.info.functions
        order = call_order(functions)
        if isinstance(order, str):
            self._decline("", "local_function", [], order)
            return
        self.visible = frozenset()  # (a call inside a function sees no main-graph input)
        for i in order:
            f = functions[i]
            path = function_path(f)
            types = self.calls.types(f)
            reason = types if isinstance(types, str) else attribute_reason(f)
            prelude: Prelude = ([], frozenset(), frozenset())
            added: list[tuple[str, TypeSpec, str]] = []  # new formals for leaves: name, type, the calls' value
            if not reason:
                opset = (dict(main.info.opset_imports) | {o.domain: o.version for o in f.opset_import}).get("", 0)
                definitions, leaves = self.calls.definitions(f, opset)
                prelude, added = call_prelude(f, definitions, leaves)
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
            self.calls.cones_of(traced_calls(g, functions))
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


def _scope_graph(parent: Graph, node: OnnxNode, attr: str, body: Body) -> tuple[Graph, onnx.GraphProto | None]:
    """The graph the rules run on for `node`'s body `attr`: the body Graph itself, its values typed
    as its typed import types them (the enclosing values it reads stay edges), and the proto it was
    written as, set aside while the rules edit it (write-back writes it again). A body the model
    holds as a proto only (a GRAPHS attribute, which no standard op has): its typed copy."""
    g = node.bodies.get(attr)
    if g is None or g.source is None:
        return body.graph, None
    typed = body.graph.values
    for name, v in g.values.items():
        t = typed.get(name)
        if t is not None and t.elem_type:
            v.elem_type, v.shape = t.elem_type, t.shape
    g.reserved = EnclosingNames(parent, subgraph_names(g))
    own = {v.name for v in g.inputs}
    g.outer_inputs = [v for v in (g.find(x.name) for x in body.graph.inputs if x.name not in own) if v is not None]
    source, g.source = g.source, None
    return g, source


def _keep_enclosing(g: Graph, result: PassResult) -> None:
    """Undo the replacements of an enclosing scope's value (a stored mask, a generator) that the
    body still reads: the enclosing graph keeps computing it, so a copy in the body is a node more
    (one that an application took in is gone already)."""
    for m in result.applied:
        r = m.replacement
        for old, new in r.replaces if r is not None else ():
            if g.is_outer(old) and new.producer is not None and new.producer.id in g.nodes \
                    and g.uses_here(new):
                rewire_body(g, new, old)
                new.uses = {}
                g.remove_node(new.producer)
