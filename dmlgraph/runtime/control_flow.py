"""If/Loop/Scan nodes and function calls whose bodies hold DML nodes, run by the executor itself.

onnxruntime cannot run a body with `com.dmlgraph` nodes, so such a node is a step of its own: its
bodies become Graphs run by a sub-executor, per ONNX semantics (docs/internals.md, runtime/control_flow.py).
Control-flow nodes whose bodies hold no DML node stay in onnxruntime sessions.
"""
from __future__ import annotations

from typing import Any, Callable, cast

import numpy as np
import onnx

from dmlgraph.errors import DmlgraphError
from dmlgraph.io.onnx_io import dml_function_keys, graphs_of, has_dml
from dmlgraph.ir.graph import CONTROL_FLOW, Graph, Node, OnnxNode, Value
from dmlgraph.rewrite.call_leaves import STANDARD, call_key
from dmlgraph.rewrite.nested import all_nodes, execution_body, execution_function
from dmlgraph.runtime.onnx_runner import numpy_dtype

Read = Callable[[str], np.ndarray]  # an enclosing value by name
MakeExecutor = Callable[[Graph], Any]  # an Executor for a body's Graph


def dml_functions(g: Graph) -> set[tuple[str, str, str]]:
    """The local functions that hold DML nodes, or call one that does."""
    return dml_function_keys(g.info.functions)


def host_nodes(g: Graph) -> dict[int, OnnxNode]:
    """The nodes of `g` onnxruntime cannot run: bodies holding DML nodes, calls of such functions."""
    hosted = dml_functions(g) if g.info.functions else set()
    found = {}
    for n in g.nodes.values():
        if n.__class__ is not OnnxNode or (n.op_type not in CONTROL_FLOW and n.domain in STANDARD):
            continue  # (the standard ops without bodies: nearly every node)
        if (n.domain not in STANDARD and call_key(n) in hosted) or \
                (n.has_subgraph and (has_dml(n.attributes) or (hosted and _calls_any(n, hosted)))):
            found[n.id] = n
    return found


def reads(g: Graph, n: Node) -> list[Value | None]:
    """What a step of `g` running `n` reads: `g.reads(n)`, and the values of scopes enclosing `g`
    that `n`'s bodies read (`g` a body: they are fed to its executor)."""
    found = g.reads(n)
    if n.__class__ is not OnnxNode or not n.bodies or g.parent is None:
        return found
    seen = {id(v) for v in found}
    more = [v for b in n.bodies.values() for v in b.free_values().values() if id(v) not in seen]
    return found + list({id(v): v for v in more}.values())


def _calls_any(n: OnnxNode, keys: set) -> bool:
    """Whether `n`'s bodies call one of these functions."""
    return any((x.domain, x.op_type, x.overload) in keys for body in graphs_of(n.attributes)
               for x in all_nodes(body.node))


class HostStep:
    """One node run here; `inputs` / `outputs` are value names, as a Region's."""

    def __init__(self, graph: Graph, node: OnnxNode, make_executor: MakeExecutor) -> None:
        self.graph, self.node, self._make = graph, node, make_executor
        self.inputs = list(dict.fromkeys(v.name for v in reads(graph, node) if v is not None))
        self.outputs = [v.name for v in node.outputs]
        self._bodies: dict[str, Any] = {}  # attribute name -> sub-executor
        self._trace: list | None = None  # this run's DML calls are appended here, when traced

    def run(self, read: Read, trace: list | None = None) -> dict[str, np.ndarray]:
        """The node's outputs; `trace` (the executor's `run_traced` list) gets the DML calls the
        bodies make, in run order."""
        n = self.node
        self._trace = trace
        if n.domain not in STANDARD:
            results = self._call(read)
        elif n.op_type == "If":
            results = self._if(read)
        elif n.op_type == "Loop":
            results = self._loop(read)
        elif n.op_type == "Scan":
            results = self._scan(read)
        else:
            raise DmlgraphError(f"cannot run {n.op_type} node {n.name!r}: its bodies hold DML nodes, and only "
                                "If, Loop, Scan and local functions are run with them")
        if len(results) < len(n.outputs):
            raise DmlgraphError(f"{n.op_type} node {n.name!r}: its body gives {len(results)} outputs, the node "
                                f"has {len(n.outputs)}")
        return {v.name: r for v, r in zip(n.outputs, results) if v.name}

    # -- bodies
    def executor(self, attr: str) -> Any:
        """The sub-executor of the body under `attr` (the node's body Graph, typed; '' for the
        called function), made once."""
        ex = self._bodies.get(attr)
        if ex is None:
            if attr == "":
                g = execution_function(self.graph, self.node)
            else:
                g = execution_body(self.graph, self.node, attr)
            ex = self._bodies[attr] = self._make(g)
        return ex

    def _run_body(self, attr: str, formal: list[np.ndarray], read: Read) -> list[np.ndarray]:
        """The body's outputs for these formal inputs (the enclosing values it reads by `read`)."""
        ex = self.executor(attr)
        g = ex.graph
        feeds = dict(zip((v.name for v in g.inputs), formal))
        for v in g.inputs[len(formal):]:  # (a called function: the leaves passed after its formals)
            feeds[v.name] = read(v.name)
        for name in g.free_values():  # the enclosing values a body reads, through its edges
            feeds[name] = read(name)
        if self._trace is None:
            out = ex.run(feeds)
        else:
            out, calls = ex.run_traced(feeds)
            self._trace.extend(calls)
        return [out[v.name] for v in g.outputs]

    def _inputs(self, read: Read) -> list[np.ndarray | None]:
        return [None if v is None else read(v.name) for v in self.node.inputs]

    # -- the ops
    def _call(self, read: Read) -> list[np.ndarray]:
        return self._run_body("", [a for a in self._inputs(read) if a is not None], read)

    def _if(self, read: Read) -> list[np.ndarray]:
        cond = np.asarray(read(cast(Value, self.node.inputs[0]).name))  # If's cond is a required input
        if cond.size != 1:
            raise DmlgraphError(f"If node {self.node.name!r}: the condition has {cond.size} elements, not one")
        return self._run_body("then_branch" if bool(cond.reshape(-1)[0]) else "else_branch", [], read)

    def _loop(self, read: Read) -> list[np.ndarray]:
        ins = self._inputs(read)
        trip = None if ins[0] is None else int(np.asarray(ins[0]).reshape(-1)[0])
        cond = True if len(ins) < 2 or ins[1] is None else bool(np.asarray(ins[1]).reshape(-1)[0])
        # ONNX requires the loop-carried inputs (only M and cond are optional), so they are arrays here
        state = list(cast(list[np.ndarray], ins[2:]))
        scans: list[list[np.ndarray]] | None = None
        i = 0
        while (trip is None or i < trip) and cond:
            out = self._run_body("body", [np.array(i, np.int64), np.array(cond)] + state, read)
            cond = bool(np.asarray(out[0]).reshape(-1)[0])
            state = out[1:1 + len(state)]
            per = out[1 + len(state):]
            scans = [[] for _ in per] if scans is None else scans
            for acc, x in zip(scans, per):
                acc.append(np.asarray(x))
            i += 1
        return state + self._stacked(scans, len(self.node.outputs) - len(state), "body", 1 + len(state))

    def _stacked(self, scans: list[list[np.ndarray]] | None, count: int, attr: str, first: int,
                 axes: list[int] | None = None, reverse: list[int] | None = None) -> list[np.ndarray]:
        """Per-iteration outputs stacked along their axis. With no iteration, as onnxruntime: empty
        arrays of the body output's type and rank, 0 on that axis and for every dim not static."""
        axes = axes or [0] * count
        if scans is None:
            ex = self.executor(attr)
            result = []
            for v, axis in zip(ex.graph.outputs[first:first + count], axes):
                shape = [d if isinstance(d, int) else 0 for d in v.shape or ()]
                shape.insert(axis + len(shape) + 1 if axis < 0 else axis, 0)
                result.append(np.zeros(shape, numpy_dtype(v.elem_type or onnx.TensorProto.FLOAT)))
            return result
        result = []
        for k, acc in enumerate(scans):
            if reverse is not None and reverse[k]:
                acc = acc[::-1]
            axis = axes[k]
            result.append(np.stack(acc, axis=axis + acc[0].ndim + 1 if axis < 0 else axis))
        return result

    def _scan(self, read: Read) -> list[np.ndarray]:
        n = self.node
        m = n.attr("num_scan_inputs")
        ins = self._inputs(read)
        n_state = len(ins) - m
        # ONNX requires Scan's state inputs, so they are arrays here
        state, scanned = cast(list[np.ndarray], ins[:n_state]), [np.asarray(x) for x in ins[n_state:]]
        in_axes = list(n.attr("scan_input_axes") or [0] * m)
        in_dirs = list(n.attr("scan_input_directions") or [0] * m)
        in_axes = [a + x.ndim if a < 0 else a for a, x in zip(in_axes, scanned)]
        lengths = {x.shape[a] for a, x in zip(in_axes, scanned)}
        if len(lengths) != 1:
            raise DmlgraphError(f"Scan node {n.name!r}: the scanned inputs have different lengths {sorted(lengths)}")
        length = lengths.pop()
        k = len(n.outputs) - n_state
        out_axes = list(n.attr("scan_output_axes") or [0] * k)
        out_dirs = list(n.attr("scan_output_directions") or [0] * k)
        scans: list[list[np.ndarray]] | None = None
        for t in range(length):
            slices = [np.take(x, length - 1 - t if d else t, axis=a) for x, a, d in zip(scanned, in_axes, in_dirs)]
            out = self._run_body("body", state + slices, read)
            state = out[:n_state]
            scans = [[] for _ in out[n_state:]] if scans is None else scans
            for acc, x in zip(scans, out[n_state:]):
                acc.append(np.asarray(x))
        return state + self._stacked(scans, k, "body", n_state, out_axes, out_dirs)
