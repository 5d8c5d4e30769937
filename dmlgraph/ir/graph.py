"""The graph IR: Values and Nodes (ONNX nodes and DML nodes side by side), with explicit links.

Every Value knows its producer and its uses, so a rule looks at neighbours in O(1) (the onnx-ir
design). The data-dependency DAG over nodes is a networkx DiGraph built on demand (`to_networkx`)
for what networkx does well: topological order and partitioning.
"""
from __future__ import annotations

import functools
import gc
import heapq
import itertools
import operator
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, ParamSpec, Protocol, TypeVar, cast

import numpy as np
import onnx

from dmlgraph.errors import ModelError
from dmlgraph.ir.ops import clamp_bound
from dmlgraph.process import policy

P = ParamSpec("P")
R = TypeVar("R")

if TYPE_CHECKING:  # networkx costs ~0.15 s to import; only analyses that ask for it load it
    import networkx as nx

Dim = int | str | None  # static size, symbolic name, or unknown
CONTROL_FLOW = frozenset({"If", "Loop", "Scan", "SequenceMap"})  # the standard ops with graph attributes
BODY_READ = -1  # the input index of a use `(node, BODY_READ)`: a body of `node` reads the value
NO_BODIES: Mapping[str, Graph] = MappingProxyType({})  # (shared by every node without bodies: no dict each)


def gc_paused(fn: Callable[P, R]) -> Callable[P, R]:
    """Run `fn` with Python's cyclic garbage collector paused (restored after, even on error),
    where the process owner allowed it (`dmlgraph.process.process_wide`; the CLI does).

    Importing, rewriting and exporting a graph allocate hundreds of thousands of small objects
    (Values, Nodes, their lists) that all live as long as the graph. The collector's full passes
    over them find nothing to free and cost about a third of an optimize at 25k nodes; reference
    counting still frees everything not in a cycle, and cycles left behind are collected after.

    On resuming, what the step allocated moves to the oldest generation (`gc.freeze` then
    `gc.unfreeze`, a list splice): else the first young collection after the pause would walk all
    of it (a tenth of a second at 30k nodes) to find it alive. Full collections still visit it.
    (Not when the process froze objects itself: unfreezing would release those too.)
    """
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        if not policy().pause_gc or not gc.isenabled():
            return fn(*args, **kwargs)
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()
    return wrapper


class Value:
    """A tensor edge: name, ONNX element type, shape, one producer, many uses.

    `initializer` (a TensorProto, possibly external data) stays unread until `const_array` asks.
    `array` holds a constant made by a rule; `decoded` a small initializer's array once read, with
    the TensorProto it was read from (a replaced initializer is read afresh).
    """

    __slots__ = ("name", "elem_type", "shape", "producer", "uses", "initializer", "array", "base_dir", "decoded")

    def __init__(self, name: str, elem_type: int | None = None, shape: tuple[Dim, ...] | None = None):
        self.name = name
        self.elem_type = elem_type
        self.shape = shape
        self.producer: Node | None = None
        # (node, input index, or BODY_READ); a dict: O(1) removal, in order
        self.uses: dict[tuple[Node, int], None] = {}
        self.initializer: onnx.TensorProto | None = None
        self.array: np.ndarray | None = None
        self.base_dir: str | None = None
        self.decoded: tuple[onnx.TensorProto, np.ndarray] | None = None

    def __repr__(self) -> str:
        return f"Value({self.name!r})"

    @property
    def static_shape(self) -> tuple[int, ...] | None:
        if self.shape is None or not all(isinstance(d, int) for d in self.shape):
            return None
        return tuple(cast("tuple[int, ...]", self.shape))

    @property
    def consumers(self) -> list["Node"]:
        return [n for n, _ in self.uses]


class Node:
    """Common part of ONNX and DML nodes: inputs (None = absent optional) and outputs."""

    __slots__ = ("id", "name", "inputs", "outputs", "rule", "added", "place")
    _ids = itertools.count()
    op_type: str = ""
    domain: str = ""

    def __init__(self, name: str, inputs: Iterable[Value | None], outputs: Iterable[Value]):
        self.id = next(Node._ids)
        self.name = name
        self.inputs: list[Value | None] = list(inputs)
        self.outputs: list[Value] = list(outputs)
        self.rule: str | None = None  # the rule that created this node
        self.added = -1  # set by Graph.add_node: orders nodes as `Graph.nodes` does
        # Where export puts the node among those ready at once: (the place of what it replaced, added).
        self.place = (-1, -1)

    def input(self, i: int) -> Value | None:
        return self.inputs[i] if i < len(self.inputs) else None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.op_type}, {self.name!r})"


class OnnxNode(Node):
    """An ONNX node passed through unchanged (attributes kept as protos; GRAPH ones are also `bodies`)."""

    __slots__ = ("op_type", "domain", "attributes", "doc_string", "source", "rewired", "bodies", "outer")

    def __init__(self, name: str, op_type: str, inputs: Iterable[Value | None], outputs: Iterable[Value],
                 attributes: Iterable[onnx.AttributeProto] = (), domain: str = "", doc_string: str = "",
                 source: onnx.NodeProto | None = None):
        super().__init__(name, inputs, outputs)
        self.op_type = op_type
        self.domain = domain
        self.attributes: list[onnx.AttributeProto] = list(attributes)
        self.doc_string = doc_string
        # The proto it was read from: export writes it back as read (with fields this class does not
        # model: metadata_props, overload), with the current value names once they differ from it
        # (`rewired`: by `Graph.replace_uses`, the only change rules make to an ONNX node, or by
        # import naming an unused output).
        self.source = source
        self.rewired = False
        # Its GRAPH attributes (If/Loop/Scan bodies) as Graphs, by attribute name (built by import,
        # `onnx_io.read_bodies`): the truth; each GRAPH attribute proto is that Graph's `source`,
        # rewritten with it (`Graph.replace_uses`, `Graph.set_bodies`). GRAPHS stay protos only.
        self.bodies: Mapping[str, Graph] = NO_BODIES
        # The values of the graph holding it that its bodies read (at any depth), by name order:
        # edges the holding graph links (`Graph.link_bodies`), each also a use `(self, BODY_READ)`.
        self.outer: list[Value] = []

    @property
    def has_subgraph(self) -> bool:
        """An If/Loop/Scan-style node: a graph-valued attribute."""
        return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in self.attributes)

    def set_attributes(self, attributes: list[onnx.AttributeProto]) -> None:
        """Replace the attributes, in the proto export writes too (`Graph.set_bodies` for a node
        with bodies: it sets the Graphs and links what they read)."""
        self.attributes = list(attributes)
        if self.source is not None:
            proto = onnx.NodeProto()
            proto.CopyFrom(self.source)
            del proto.attribute[:]
            proto.attribute.extend(self.attributes)
            self.source = proto

    def attr(self, name: str, default: Any = None) -> Any:
        for a in self.attributes:
            if a.name == name:
                return onnx.helper.get_attribute_value(a)
        return default


class DmlNode(Node):
    """A DIAGONAL_MATRIX1 (or DIAGONAL_MATRIX) node, as a template bound at run time.

    inputs: [x, shape, k], each optional.
      x     -- the input tensor (broadcast to the output shape; a scalar is broadcast by zero strides)
      shape -- int64 1-D output sizes computed at run time (else `static_shape`, else x's shape)
      k     -- int64 scalar shifting every bounded end of [begin, end) at run time (Trilu's k)
    and, optionally, a fourth: `matrix`, an int64 vector holding the sizes of the mask this node
    applies ([H, W], ones then [H, W], or its whole shape: the model's own). The node is then the
    band of that mask broadcast with x and `shape`, as the model computed it (docs/semantics.md):
    plain DIAGONAL_MATRIX1 where the mask's [H, W] is the output's matrix, which the rewrite proved
    unless `claimed`. Unclaimed, the DML export drops it (only the portable export reads it);
    `claimed` (the proof took a dim name several graph inputs declare for one size) keeps it on
    every target, and the node reads it when it runs.
    begin/end are int64-space bounds (None = unbounded, never shifted). They are clamped to the
    matrix ([-H, W]) only when bound to a concrete shape, so a huge k never wraps. `exact` says
    whether the rewrite that made it is bit-exact for every input.
    """

    __slots__ = ("elem_type", "value", "begin", "end", "static_shape", "exact", "kind", "portable_form",
                 "portable_nodes", "portable_exact", "claimed")
    domain = "com.dmlgraph"

    def __init__(self, name: str, x: Value | None, shape: Value | None, k: Value | None, output: Value, *,
                 elem_type: int, value: np.generic, begin: int | None, end: int | None,
                 static_shape: Iterable[int] | None = None, exact: bool = True, kind: str = "DiagonalMatrix1",
                 matrix: Value | None = None, claimed: bool = False):
        super().__init__(name, [x, shape, k] if matrix is None else [x, shape, k, matrix], [output])
        self.claimed = claimed and matrix is not None
        self.elem_type = elem_type
        self.value = value
        # (Kept inside +-2^62, as `ops.clamp_bound` does: a bound past any matrix means the same
        # there, and k + 1 of a k = 2^63 - 1 would not fit the int64 attribute it is written to.)
        self.begin = clamp_bound(begin)
        self.end = clamp_bound(end)
        self.static_shape = None if static_shape is None else tuple(int(s) for s in static_shape)
        self.exact = exact
        self.kind = kind  # "DiagonalMatrix1", or "DiagonalMatrix" below feature level 5_1
        # What the portable export wrote for it ("one Trilu", ... ; `io.portable.form`), once exported
        self.portable_form: str | None = None
        # Its portable nodes: (mask part, whole site incl. the select applying it; `io.portable.MASK`)
        self.portable_nodes: tuple[int, int] | None = None
        # Whether that form is bit-exact (False: it turns a -0.0 of the data into +0.0; not under --exact)
        self.portable_exact = True

    @property
    def op_type(self) -> str:  # type: ignore[override]
        return self.kind

    @property
    def operands(self) -> tuple[Value | None, Value | None, Value | None]:
        """(x, shape, k): what the node computes from (the `matrix` hint aside)."""
        x, shape, k = self.inputs[:3]
        return x, shape, k

    @property
    def matrix(self) -> Value | None:
        return self.inputs[3] if len(self.inputs) > 3 else None


@dataclass
class ModelInfo:
    """What a model carries besides its graph, kept so export round-trips it."""

    ir_version: int = 10
    opset_imports: dict[str, int] = field(default_factory=dict)
    producer_name: str = ""
    producer_version: str = ""
    domain: str = ""
    model_version: int = 0
    doc_string: str = ""
    metadata_props: list[tuple[str, str]] = field(default_factory=list)
    graph_name: str = "graph"
    graph_doc_string: str = ""
    functions: list[onnx.FunctionProto] = field(default_factory=list)
    base_dir: str | None = None  # where the model's external data is (its subgraphs' tensors too)
    notes: list[str] = field(default_factory=list)  # what loading took though onnx's checks refuse it
    source: onnx.ModelProto | None = None  # the imported model itself (not a copy), for analyses that re-infer it


class ReservedNames(Protocol):
    """`Graph.reserved`: a set of names, or a body's view of its enclosing scopes' (`nested.enclosing.EnclosingNames`)."""

    def __contains__(self, name: object, /) -> bool: ...

    def __ior__(self, names: set[str], /) -> ReservedNames: ...


class Graph:
    """Values, nodes, graph inputs/outputs and initializers of one ONNX graph: the main one, or an
    If/Loop/Scan body (`holder`, `parent`), whose nodes read enclosing values as the enclosing
    `Value` objects themselves (edges; the enclosing value's uses list the holder, `BODY_READ`)."""

    def __init__(self, info: ModelInfo | None = None, holder: OnnxNode | None = None,
                 parent: Graph | None = None, source: onnx.GraphProto | None = None):
        self.info = info or ModelInfo()
        # A body: the node holding it, the graph holding that node, and the GraphProto it is written
        # as (as read, then rewritten with each edit: `replace_uses`, `set_bodies`).
        self.holder = holder
        self.parent = parent
        self.source = source
        # A lowered body as the portable target writes it, made from the graph its rules ran on
        # (`rewrite.nested.write_back.write_back`): (the `source` it was made for, it); stale once `source` changes.
        self.portable: tuple[onnx.GraphProto, onnx.GraphProto] | None = None
        # Holders added while the graph is being read: linked once all its values exist (`finish_reading`)
        self.reading: list[OnnxNode] | None = None
        self.values: dict[str, Value] = {}
        self.nodes: dict[int, Node] = {}  # insertion-ordered: original order first
        self.by_op: dict[str, dict[int, Node]] = {}  # op type -> its nodes, each in `nodes` order
        self._added = itertools.count()  # Node.added: the position in `nodes` order
        self.inputs: list[Value] = []
        # A body's rules take these enclosing values as inputs too (the extra inputs of its typed
        # import: what it reads, or the leaves of the enclosing cones it reads through): `rule_inputs`.
        self.outer_inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.initializers: dict[str, Value] = {}
        self.value_info_names: dict[str, None] = {}  # values the source model annotated, in its order (kept on export)
        self.overridable_inputs: list[str] = []  # initializers the source also listed as graph inputs
        # Every node added, removed or rewired (replace_uses), oldest first: an analysis that read
        # the graph at len(changes) == i can update itself from changes[i:] instead of starting over.
        self.changes: list[Node] = []
        self._clean: tuple | None = None  # the graph's state after remove_dead last ran
        self._names = itertools.count()
        # Names used by other scopes of the model (subgraph bodies, enclosing graphs): a new value
        # never takes one, so a lowered body never redefines a name its scopes can see.
        self.reserved: ReservedNames = set()
        # Whether a rule weighed a node's serialized size, which its names' lengths are part of
        # (`body_reuse` does not rename such a lowering into another body's names).
        self.sized_names = False

    # ---- values ---------------------------------------------------------------------------
    def value(self, name: str) -> Value:
        v = self.values.get(name)
        if v is None:
            v = self.values[name] = Value(name)
        return v

    def find(self, name: str) -> Value | None:
        """The value `name` means here: this graph's own, else an enclosing graph's."""
        g = self.owner(name)
        return None if g is None else g.values[name]

    def owner(self, name: str) -> Graph | None:
        """The graph of this one's scopes (itself or an enclosing one) whose value `name` is."""
        g: Graph | None = self
        while g is not None and name not in g.values:
            g = g.parent
        return g

    @property
    def rule_inputs(self) -> list[Value]:
        """The graph's inputs as the rules see them: its own, then a body's `outer_inputs`."""
        return self.inputs + self.outer_inputs if self.outer_inputs else self.inputs

    def stored(self, v: Value) -> bool:
        """Whether `v` is an initializer of this graph or of an enclosing one (a body reads its
        scopes' constants through edges)."""
        if v.name in self.initializers:
            return True
        g = self.parent
        while g is not None and g.values.get(v.name) is not v:
            g = g.parent
        return g is not None and v.name in g.initializers and v.name not in g.overridable_inputs

    def is_outer(self, v: Value) -> bool:
        """Whether `v` is an enclosing scope's value, which this graph reads through an edge."""
        return self.values.get(v.name) is not v and self.find(v.name) is v

    def sees(self, n: Node) -> bool:
        """Whether `n` is a node of this graph or of an enclosing one."""
        g: Graph | None = self
        while g is not None and n.id not in g.nodes:
            g = g.parent
        return g is not None

    def uses_here(self, v: Value) -> list[tuple[Node, int]]:
        """`v`'s uses in this graph: its own, or, for an enclosing scope's value (whose uses list
        the holder), the nodes of this graph that read it and the holders whose bodies do."""
        if not self.is_outer(v):
            return list(v.uses)
        found: list[tuple[Node, int]] = []
        for n in self.nodes.values():
            found += [(n, i) for i, x in enumerate(n.inputs) if x is v]
            if n.__class__ is OnnxNode and n.bodies and any(b.free_values().get(v.name) is v for b in n.bodies.values()):
                found.append((n, BODY_READ))  # (`outer` lists this graph's values only)
        return found

    def visible_readers(self, v: Value) -> list[Node]:
        """The nodes of this graph and of its enclosing ones that read `v` (what a size a body
        needs may be read off: an enclosing node's output is an edge away)."""
        here = [n for n, _ in self.uses_here(v)]
        return here + [n for n in v.consumers if n not in here] if self.is_outer(v) else here

    def free_values(self) -> dict[str, Value]:
        """The values of enclosing graphs this graph reads (its nodes, its bodies at any depth, its
        outputs), by name."""
        found: dict[str, Value] = {}
        values = self.values
        reads: list[Value | None] = list(self.outputs)
        for n in self.nodes.values():
            reads += n.inputs
            if n.__class__ is OnnxNode:
                for b in n.bodies.values():
                    reads += b.free_values().values()
        for v in reads:
            if v is not None and values.get(v.name) is not v:
                found.setdefault(v.name, v)
        return found

    def fresh_value(self, hint: str, elem_type: int | None = None, shape: tuple[Dim, ...] | None = None) -> Value:
        name = hint
        while name in self.values or name in self.reserved:
            name = f"{hint}__{next(self._names)}"
        v = self.values[name] = Value(name, elem_type, shape)
        return v

    def fresh_name(self, hint: str) -> str:
        """A node name: unique enough for readers; ONNX does not require node names to be unique."""
        return f"{hint}__{next(self._names)}"

    def add_initializer(self, value: Value, array: np.ndarray) -> Value:
        value.array = np.asarray(array)
        value.elem_type = onnx.helper.np_dtype_to_tensor_dtype(value.array.dtype)
        value.shape = tuple(value.array.shape)
        self.initializers[value.name] = value
        return value

    # ---- nodes ----------------------------------------------------------------------------
    def add_node(self, node: Node, instead_of: int | None = None) -> Node:
        """Add `node`; `instead_of` (the place of what it replaces) puts it there in the export order."""
        self.nodes[node.id] = node
        same_op = self.by_op.get(node.op_type)
        if same_op is None:
            same_op = self.by_op[node.op_type] = {}
        same_op[node.id] = node
        node.added = added = next(self._added)
        node.place = (added if instead_of is None else instead_of, added)
        values = self.values if self.parent is not None else None  # (a body: enclosing values list the holder)
        for i, v in enumerate(node.inputs):
            if v is not None and (values is None or values.get(v.name) is v):
                v.uses[node, i] = None
        if node.__class__ is OnnxNode and node.attributes:  # (no attributes: no bodies)
            if self.reading is not None:
                if node.has_subgraph:
                    self.reading.append(node)
            else:
                self.link_bodies(node)
        for v in node.outputs:
            if v.producer is not None and v.producer is not node:
                raise ModelError(f"value {v.name!r} is produced by two nodes "
                                 f"({v.producer.name!r} and {node.name!r})")
            v.producer = node
        self.changes.append(node)
        return node

    def finish_reading(self) -> list[OnnxNode]:
        """End reading (`reading`): the holders added meanwhile, for their bodies to be read and linked."""
        holders, self.reading = self.reading or [], None
        return holders

    def link_bodies(self, node: OnnxNode) -> None:
        """Make the values of this graph that `node`'s bodies read (their edges at any depth) its
        `outer` edges and uses (again: after its bodies changed)."""
        for v in node.outer:
            v.uses.pop((node, BODY_READ), None)
        values = self.values
        read: dict[str, Value] = {}
        for b in node.bodies.values():
            b.parent = self
            for name, v in b.free_values().items():
                if values.get(name) is v:
                    read[name] = v
        # (GRAPHS attributes, and a node made with bodies no reader built: by name, from the protos)
        for name in _graphs_reads(node) if node.bodies else _proto_reads(node):
            if name in values:
                read[name] = values[name]
        node.outer = [read[name] for name in sorted(read)]
        for v in node.outer:
            v.uses[node, BODY_READ] = None

    def set_bodies(self, node: OnnxNode, attributes: list[onnx.AttributeProto], bodies: Mapping[str, Graph]) -> None:
        """Replace `node`'s attributes and their Graphs (`bodies`: read from those attributes, its
        bodies lowered) and link what they read now."""
        node.set_attributes(attributes)
        node.bodies = bodies
        for b in bodies.values():
            b.holder = node
        self.link_bodies(node)
        self.changes.append(node)
        self._rewritten({node.id})

    def remove_node(self, node: Node, relink: bool = True) -> None:
        """Remove `node` and its uses. In a body, an enclosing value it read lists the holder, not
        it (`add_node`): the holders up the scopes are linked again (`relink`), so an enclosing
        value the body no longer reads loses the holder's use."""
        if relink and self.source is not None:
            self._unwrite([node])
        del self.nodes[node.id]
        del self.by_op[node.op_type][node.id]
        values = self.values if self.parent is not None else None
        enclosing = values is not None and node.__class__ is OnnxNode and bool(node.bodies)
        for i, v in enumerate(node.inputs):
            if v is not None:
                if values is None or values.get(v.name) is v:
                    del v.uses[node, i]
                else:
                    enclosing = True
        if node.__class__ is OnnxNode:
            for v in node.outer:
                v.uses.pop((node, BODY_READ), None)
        for v in node.outputs:
            if v.producer is node:
                v.producer = None
        self.changes.append(node)
        if enclosing and relink:
            self.relink_holders()

    def _unwrite(self, nodes: list[Node]) -> None:
        """Drop `nodes` from this body's `source` (node for node with the Graph's, in order) and write
        the holders' attributes and the enclosing bodies' sources up the scopes again."""
        gone = {n.id for n in nodes}
        proto = onnx.GraphProto()
        proto.CopyFrom(cast(onnx.GraphProto, self.source))
        for k in reversed([k for k, n in enumerate(self.nodes.values()) if n.id in gone]):
            del proto.node[k]
        self.source = proto
        g = self
        while g.holder is not None and g.parent is not None:
            g.holder.set_attributes(_body_attributes(g.holder))
            if g.parent.source is None:
                break
            g.parent.source = _written(g.parent, {g.holder.id})
            g = g.parent

    def relink_holders(self) -> None:
        """Link this body's holder again in its graph, and so on up the scopes (what the bodies
        read of each enclosing graph is its holder's `outer` and uses)."""
        g = self
        while g.parent is not None and g.holder is not None:
            g.parent.link_bodies(g.holder)
            g.parent.changes.append(g.holder)  # (its reads changed: the enclosing `remove_dead` looks again)
            g = g.parent

    def drop_matrix(self, node: DmlNode) -> None:
        """Forget `node`'s `matrix` hint (an export that will not read it): what only it read
        is dead at the next `remove_dead`."""
        v = node.matrix
        if v is not None:
            del node.inputs[3]
            if self.is_outer(v):  # (its uses list the holder)
                self.relink_holders()
            else:
                del v.uses[node, 3]
            self.changes.append(node)

    def replace_uses(self, old: Value, new: Value) -> None:
        """Point every use of `old` (and graph outputs) at `new`, the reads of the bodies of this
        graph's nodes included (their protos rewritten to name `new`)."""
        rewired: set[int] = set()
        kept: dict[tuple[Node, int], None] = {}  # a node made with bodies no reader built reads `old` by name
        for node, i in list(old.uses):
            if i == BODY_READ and not cast(OnnxNode, node).bodies:
                kept[node, i] = None
                continue
            if i == BODY_READ:
                holder = cast(OnnxNode, node)
                for b in holder.bodies.values():
                    rewire_body(b, old, new)
                holder.set_attributes(_body_attributes(holder))
                self.link_bodies(holder)
            else:
                node.inputs[i] = new
                if isinstance(node, OnnxNode):
                    node.rewired = True
                new.uses[node, i] = None
            rewired.add(node.id)
            self.changes.append(node)
        old.uses = kept
        for i, out in enumerate(self.outputs):
            if out is old:
                self.outputs[i] = new
                rewired.add(-1)
        if rewired:
            self._rewritten(rewired)

    def rewire_scope(self, old: Value, new: Value) -> None:
        """Point this body's reads of `old`, an enclosing scope's value, at `new`, one of its own
        (a rule replaced what the body reads, not what the enclosing graph computes)."""
        rewire_body(self, old, new)
        for n in self.nodes.values():
            for i, v in enumerate(n.inputs):
                if v is new:
                    new.uses[n, i] = None
            if n.__class__ is OnnxNode and n.bodies:
                self.link_bodies(n)  # (its bodies may read `new` now)
        self.relink_holders()

    def _rewritten(self, nodes: set[int]) -> None:
        """In a body: write these nodes (ids; -1: the outputs) into its proto again, then its holder's."""
        if self.holder is None or self.source is None:
            return
        self.source = _written(self, nodes)
        holder, parent = self.holder, self.parent
        holder.set_attributes(_body_attributes(holder))
        if parent is not None:
            parent._rewritten({holder.id})

    def portable_source(self) -> onnx.GraphProto | None:
        """The portable form of this body, if it was made for the proto the body is now."""
        p = self.portable
        return p[1] if p is not None and p[0] is self.source else None

    def iter_nodes(self) -> Iterator[Node]:
        return iter(list(self.nodes.values()))

    def is_graph_output(self, v: Value) -> bool:
        return v in self.outputs  # (a Value equals only itself: no __eq__)

    def body_reads(self) -> set[str]:
        """The names of the values the bodies of this graph's If/Loop/Scan nodes read (a value
        read there meets data as an output does)."""
        names: set[str] = set()
        for op in CONTROL_FLOW:
            for n in self.by_op.get(op, {}).values():
                names.update([v.name for v in cast(OnnxNode, n).outer])  # by_op holds these ops' OnnxNodes
        return names

    # ---- analysis -------------------------------------------------------------------------
    def to_networkx(self) -> nx.DiGraph:
        """The node DAG (node id -> node id per data edge); node attr 'node' is the Node."""
        import networkx as nx

        g = nx.DiGraph()
        for n in self.nodes.values():
            g.add_node(n.id, node=n)
        for n in self.nodes.values():
            for v in self.reads(n):
                if v is not None and v.producer is not None and v.producer.id in self.nodes:
                    g.add_edge(v.producer.id, n.id)
        return g

    def reads(self, n: Node) -> list[Value | None]:
        """The values `n` reads: its inputs, then the values its bodies read (`OnnxNode.outer`)."""
        if n.__class__ is not OnnxNode or not n.outer:
            return n.inputs
        return n.inputs + n.outer

    def topological_order(self) -> list[Node]:
        """Nodes in a dependency order that keeps the original order where it can (stable).

        The order networkx's `lexicographical_topological_sort` gives on `to_networkx()` keyed by
        `Node.place`: a node a rewrite added takes the place of what it replaced, so that optimizing
        a written model again gives the same order (the tests compare the two), computed on the node
        links directly: building the networkx graph costs more than the sort on a large model. When
        that order already is a dependency order (an imported model before any rewrite), it is the
        answer.
        """
        nodes = sorted(self.nodes.values(), key=_place)
        position = {n.id: i for i, n in enumerate(nodes)}
        preds: list[list[int]] = []  # (a producer read twice is listed twice: counted and released twice)
        in_order = True
        reads = self.reads
        for i, n in enumerate(nodes):  # (plain loops: this runs on every export)
            ps = []
            for v in (n.inputs if n.__class__ is not OnnxNode or not n.attributes else reads(n)):
                if v is not None and v.producer is not None:
                    j = position.get(v.producer.id)
                    if j is not None:
                        ps.append(j)
                        in_order = in_order and j < i
            preds.append(ps)
        if in_order:
            return nodes
        # Kahn's algorithm, always taking the ready node that came first: a scan takes the nodes in
        # order, each one ready when reached; one that becomes ready only after the scan passed it
        # waits in a heap, which goes first (all it holds came before the scan's next node). The
        # heap stays small where most of the order holds.
        succs: list[list[int]] = [[] for _ in nodes]
        for i, ps in enumerate(preds):
            for p in ps:
                succs[p].append(i)
        waiting = [len(ps) for ps in preds]
        order = []
        late: list[int] = []
        scan, end = 0, len(nodes)
        while True:
            if late:
                i = heapq.heappop(late)
            else:
                while scan < end and waiting[scan]:
                    scan += 1
                if scan == end:
                    break
                i, scan = scan, scan + 1
            order.append(nodes[i])
            for s in succs[i]:
                waiting[s] -= 1
                if waiting[s] == 0 and s < scan:
                    heapq.heappush(late, s)
        if len(order) < len(nodes):
            import networkx as nx

            cycle = nx.find_cycle(self.to_networkx())
            names = [self.nodes[a].name or self.nodes[a].op_type for a, _ in cycle]
            raise ModelError(f"the graph has a cycle through nodes {names}",
                             hint="an ONNX graph must be acyclic; re-export the model")
        return order

    def remove_dead(self) -> int:
        """Remove nodes whose outputs reach no graph output, and unused initializers.

        Nothing new can be dead while no node, initializer or graph output changed since the last
        call (the pass manager calls it after each sweep that rewrote something, then the caller):
        that call returns at once."""
        if self._dead_state() == self._clean:
            return 0
        removed = self._remove_dead()
        self._clean = self._dead_state()
        return removed

    def mark_clean(self) -> None:
        """Record that nothing in the graph is dead (the caller removed what its changes left)."""
        self._clean = self._dead_state()

    def _dead_state(self) -> tuple:
        return len(self.changes), tuple(self.initializers), tuple(map(id, self.outputs))

    def _remove_dead(self) -> int:
        live: set[int] = set()
        stack = [v.producer for v in self.outputs if v.producer is not None]
        own = self.nodes if self.parent is not None else None  # (a body: an enclosing producer is not its own)
        while stack:  # (the hottest loop of a sweep's clean-up: kept plain)
            n = stack.pop()
            if n.id in live or (own is not None and n.id not in own):
                continue
            live.add(n.id)
            for v in n.inputs:
                if v is not None:
                    p = v.producer
                    if p is not None and p.id not in live:
                        stack.append(p)
            if n.__class__ is OnnxNode:  # what its bodies read lives as long as it does
                for v in n.outer:
                    if v.producer is not None:
                        stack.append(v.producer)
        dead = [n for n in self.nodes.values() if n.id not in live]
        if dead and self.source is not None:
            self._unwrite(dead)
        for n in dead:
            self.remove_node(n, relink=False)
        if dead and self.parent is not None:
            self.relink_holders()
        outputs = {v.name for v in self.outputs}
        for name in [k for k, v in self.initializers.items() if not v.uses and k not in outputs]:
            del self.initializers[name]
        return len(dead)


CONSTANT_DTYPES = {"value_int": np.int64, "value_ints": np.int64, "value_float": np.float32, "value_floats": np.float32}


def constant_attribute_value(a: onnx.AttributeProto) -> np.ndarray | None:
    """What a Constant node's attribute holds: its `value` tensor, or the number (list) of
    `value_int(s)` / `value_float(s)` in the dtype onnx gives it, not numpy's default (the dynamo
    exporter and onnxsim write those forms); None for another kind (sparse, strings)."""
    if a.name == "value":
        return onnx.numpy_helper.to_array(a.t)
    dtype = CONSTANT_DTYPES.get(a.name)
    return None if dtype is None else np.array(onnx.helper.get_attribute_value(a), dtype)


def copied(v: Value | None) -> Value | None:
    """What `v` copies: through every standard Identity making it (a tool's alias of a tensor,
    an optimizer's leftover), the value it is at run time; `v` itself when no Identity makes it."""
    for _ in range(64):  # (a longer chain is left as it is: still true, only less general)
        p = v.producer if v is not None else None
        if not (isinstance(p, OnnxNode) and p.op_type == "Identity" and p.domain in ("", "ai.onnx")
                and len(p.inputs) == 1 and p.inputs[0] is not None):
            break
        v = p.inputs[0]
    return v


def copies(v: Value) -> list[Value]:
    """`v` and every value a chain of standard Identity nodes copies it to (`copied`'s reverse):
    what reads one of them reads `v`."""
    found, i = [v], 0
    while i < len(found) and len(found) <= 64:
        found += [n.outputs[0] for n in found[i].consumers if isinstance(n, OnnxNode) and n.op_type == "Identity"
                  and n.domain in ("", "ai.onnx") and len(n.outputs) == 1 and n.outputs[0] not in found]
        i += 1
    return found


def produced_by(v: Value | None, op_type: str) -> OnnxNode | None:
    """`v`'s producer when it is the standard op `op_type` (seen through Identity, `copied`)."""
    v = v if op_type == "Identity" else copied(v)
    p = v.producer if v is not None else None
    ok = isinstance(p, OnnxNode) and p.op_type == op_type and p.domain in ("", "ai.onnx")
    return p if ok else None  # type: ignore[return-value]


def _graphs_reads(node: OnnxNode) -> set[str]:
    """The names a node's GRAPHS attributes (still protos: no standard op has one) read from outside."""
    names: set[str] = set()
    for a in node.attributes:
        if a.type == onnx.AttributeProto.GRAPHS:
            for g in a.graphs[:]:  # (a slice: a loop over a upb container ends by raising IndexError)
                names |= free_names(g)
    return names


_place = operator.attrgetter("place")


def _proto_reads(node: OnnxNode) -> set[str]:
    """The names a node's bodies read from outside, from their protos (bodies not read as Graphs)."""
    names: set[str] = set()
    for a in node.attributes:
        graphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs[:]
        for g in graphs:
            names |= free_names(g)
    return names


def rewire_body(b: Graph, old: Value, new: Value) -> None:
    """Point the reads of `old` by `b`'s nodes, outputs and nested bodies at `new`, and write them
    (a `new` of the same name: the protos stay as they are)."""
    changed: set[int] = set()
    for n in b.nodes.values():
        if any(v is old for v in n.inputs):
            n.inputs = [new if v is old else v for v in n.inputs]
            changed.add(n.id)
        if n.__class__ is OnnxNode and n.bodies:
            holder = n
            if any(old in body.free_values().values() for body in holder.bodies.values()):
                for body in holder.bodies.values():
                    rewire_body(body, old, new)
                if old.name != new.name:
                    holder.set_attributes(_body_attributes(holder))
                changed.add(n.id)
    if any(v is old for v in b.outputs):
        b.outputs = [new if v is old else v for v in b.outputs]
        changed.add(-1)
    if changed and b.source is not None and old.name != new.name:
        b.source = _written(b, changed)


def _written(b: Graph, changed: set[int]) -> onnx.GraphProto:
    """`b.source` with the input names and attributes of the `changed` nodes (ids; -1: the graph's
    outputs) written from the Graph (its nodes are its proto's, one to one, in order)."""
    proto = onnx.GraphProto()
    proto.CopyFrom(cast(onnx.GraphProto, b.source))
    for k, n in enumerate(b.nodes.values()):
        if n.id not in changed:
            continue
        p = proto.node[k]
        if n.__class__ is OnnxNode:
            del p.input[:]
            p.input.extend("" if v is None else v.name for v in n.inputs)
            del p.attribute[:]
            p.attribute.extend(n.attributes)
            n.source = p
        else:  # a DML node: its proto's inputs are its own from the first (DiagonalMatrix: from the second)
            skip = 1 if n.op_type == "DiagonalMatrix" else 0
            for j in range(len(p.input)):
                v = n.inputs[j + skip]
                p.input[j] = "" if v is None else v.name
    if -1 in changed:
        for vi, v in zip(proto.output, b.outputs):
            vi.name = v.name
    return proto


def _body_attributes(holder: OnnxNode) -> list[onnx.AttributeProto]:
    """`holder`'s attributes with each GRAPH one holding its body Graph's proto."""
    out = []
    for a in holder.attributes:
        body = holder.bodies.get(a.name) if a.type == onnx.AttributeProto.GRAPH else None
        if body is not None and body.source is not None and body.source is not a.g:
            written = onnx.AttributeProto(name=a.name, type=a.type)
            if a.HasField("doc_string"):
                written.doc_string = a.doc_string
            written.g.CopyFrom(body.source)
            a = written
        out.append(a)
    return out


def free_names(g: onnx.GraphProto) -> set[str]:
    """Names a graph (with its own subgraphs) reads but does not define: its outer-scope reads."""
    defined = {i.name for i in g.input} | {t.name for t in g.initializer} if g.input or g.initializer else set()
    read: set[str] = set()  # (the nodes' inputs, "" for a missing one dropped below: no step per name)
    used: set[str] = set()
    # ([:]: a protobuf repeated field read as a list in one call; iterated as it is, it ends by raising
    # and formatting an IndexError, ~0.5 us, which is most of the cost for a field of 1-3 items)
    for n in g.node[:]:
        read.update(n.input[:])
        for a in n.attribute[:]:
            if a.type == onnx.AttributeProto.GRAPH:
                used |= free_names(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sub in a.graphs[:]:
                    used |= free_names(sub)
        defined.update(n.output[:])
    read.discard("")
    used |= read
    used.update([o.name for o in g.output[:]])
    return used - defined
