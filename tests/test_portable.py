"""The portable target's Trilu-first forms (`dmlgraph.io.portable`) and the no-growth guarantee.

- What onnxruntime's CPU kernels keep, bit for bit (the facts the forms rest on).
- Every form against the DIAGONAL_MATRIX1 kernel, bit for bit, on data with -0.0 and NaN payloads,
  with static and run-time k, and how many standard nodes each takes.
- Every corpus model, both targets: no more nodes, no more bytes (past the provenance metadata),
  the mask part of each lowered site in a few standard nodes, and the provenance itself.
"""
from __future__ import annotations

import glob
import json
import os

import mutations
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import dmlgraph
from dmlgraph import costs, pipeline
from dmlgraph.io import onnx_io, portable
from dmlgraph.ir.graph import DmlNode

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = sorted(glob.glob(os.path.join(ROOT, "models", "*.onnx"))
                + glob.glob(os.path.join(ROOT, "models", "synthetic", "*.onnx")))
ALL_TYPES = {T.FLOAT: np.float32, T.DOUBLE: np.float64, T.FLOAT16: np.float16, T.INT8: np.int8, T.INT16: np.int16,
             T.INT32: np.int32, T.INT64: np.int64, T.UINT8: np.uint8, T.UINT16: np.uint16, T.UINT32: np.uint32,
             T.UINT64: np.uint64, T.BOOL: np.bool_}
UINT = {np.float16: np.uint16, np.float32: np.uint32, np.float64: np.uint64}


def _session(nodes, inputs, outputs, opset=21):
    m = h.make_model(h.make_graph(nodes, "g", inputs, outputs), opset_imports=[h.make_opsetid("", opset)], ir_version=10)
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])


def _specials(dt) -> np.ndarray:
    """-0.0, signaling and quiet NaNs with payloads (both signs), a finite value: a 6x6 matrix."""
    bits = {np.float16: [0x8000, 0x7C01, 0x7E05, 0xFD01, 0x3C00],
            np.float32: [0x80000000, 0x7F800001, 0x7FC00005, 0xFF800123, 0x3F800000],
            np.float64: [0x8000000000000000, 0x7FF0000000000001, 0x7FF8000000000005, 0xFFF0000000000123,
                         0x3FF0000000000000]}[dt]
    return np.resize(np.array(bits, UINT[dt]), 36).reshape(6, 6).view(dt)


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(np.uint8).reshape(a.shape + (-1,)) if a.dtype != np.bool_ else a


# ---- onnxruntime's kernels -------------------------------------------------------------------------
def _runs(op: str, et: int) -> bool:
    vi = h.make_tensor_value_info
    try:
        if op == "Trilu":
            s = _session([h.make_node("Trilu", ["x"], ["y"])], [vi("x", et, None)], [vi("y", et, None)])
            s.run(None, {"x": np.ones((2, 3), ALL_TYPES[et])})
        else:
            s = _session([h.make_node("Where", ["c", "x", "x"], ["y"])], [vi("c", T.BOOL, None), vi("x", et, None)],
                         [vi("y", et, None)])
            s.run(None, {"c": np.ones((2, 3), bool), "x": np.ones((2, 3), ALL_TYPES[et])})
        return True
    except Exception:  # noqa: BLE001 - no kernel for the type
        return False


def test_onnxruntime_trilu_and_where_types():
    """The types the forms use each op for are exactly those onnxruntime's CPU kernels run."""
    assert {et for et in ALL_TYPES if _runs("Trilu", et)} == portable.TRILU_TYPES
    assert {et for et in ALL_TYPES if _runs("Where", et)} == portable.WHERE_TYPES | {T.FLOAT16}


@pytest.mark.parametrize("dt", [np.float32, np.float64, np.float16])
def test_which_onnxruntime_ops_keep_every_bit(dt):
    """Trilu copies float32/float64 data bit for bit (float16: NaN payloads change); Where keeps its
    false branch's bits (float16: not), and drops a -0.0 of its true branch; Expand copies."""
    et = {np.float32: T.FLOAT, np.float64: T.DOUBLE, np.float16: T.FLOAT16}[dt]
    vi = h.make_tensor_value_info
    x = _specials(dt)
    exact = dt != np.float16
    for upper in (0, 1):
        y = _session([h.make_node("Trilu", ["x"], ["y"], upper=upper)], [vi("x", et, None)],
                     [vi("y", et, None)]).run(None, {"x": x})[0]
        kept = np.triu(np.ones((6, 6), bool)) if upper else np.tril(np.ones((6, 6), bool))
        assert (_bits(y) == _bits(x)).all(-1)[kept].all() == exact
        assert (_bits(y)[~kept] == 0).all()  # +0 written
    cond = np.triu(np.ones((6, 6), bool), 1)
    where = _session([h.make_node("Where", ["c", "v", "x"], ["y"])], [vi("c", T.BOOL, None), vi("v", et, None),
                                                                       vi("x", et, None)], [vi("y", et, None)])
    y = where.run(None, {"c": cond, "v": np.array(7, dt), "x": x})[0]  # x in the false branch
    assert (_bits(y) == _bits(x)).all(-1)[~cond].all() == exact
    y = where.run(None, {"c": cond[:1], "v": np.array(7, dt), "x": np.stack([x, x])})[0]  # broadcast condition
    assert (_bits(y) == _bits(np.stack([x, x]))).all(-1)[:, ~cond[:1].repeat(6, 0)].all() == exact
    y = where.run(None, {"c": ~cond, "v": np.array(7, dt), "x": x})[0]
    y = where.run(None, {"c": cond, "v": x, "x": np.array(7, dt)})[0]  # x in the true branch
    assert not (_bits(y) == _bits(x)).all(-1)[cond].all()  # -0.0 comes out +0.0
    e = _session([h.make_node("Expand", ["x", "s"], ["y"])], [vi("x", et, None), vi("s", T.INT64, [3])],
                 [vi("y", et, None)]).run(None, {"x": x, "s": np.array([2, 6, 6])})[0]
    assert (_bits(e) == _bits(np.stack([x, x]))).all()


def test_onnxruntime_runs_a_not_where_with_the_branches_swapped():
    """band_w2's own select, `Where(Not(c), -inf, X)`, runs in onnxruntime as `Where(c, X, -inf)`
    (its graph optimizer's Not/Where fusion): a -0.0 of X comes out +0.0 with the optimizer on, and
    is kept with it off. So `Where(window, X, -inf)` (a 3-node mask part) would equal onnxruntime's
    optimized run of the original, not the DML node nor the unoptimized original: the portable form
    keeps X in Where's false branch (docs/portable.md, "Two-sided bands")."""
    vi = h.make_tensor_value_info
    m = h.make_model(h.make_graph(
        [h.make_node("Not", ["c"], ["n"]), h.make_node("Where", ["n", "v", "x"], ["y"])], "g",
        [vi("c", T.BOOL, [6, 6]), vi("x", T.FLOAT, [6, 6])], [vi("y", T.FLOAT, [6, 6])],
        [numpy_helper.from_array(np.array(-np.inf, np.float32), "v")]),
        opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    x = np.full((6, 6), -0.0, np.float32)
    feeds = {"c": np.ones((6, 6), bool), "x": x}
    kept = {}
    for level in (ort.GraphOptimizationLevel.ORT_ENABLE_ALL, ort.GraphOptimizationLevel.ORT_DISABLE_ALL):
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        y = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        kept[level] = bool(np.signbit(y).all())
    assert kept == {ort.GraphOptimizationLevel.ORT_ENABLE_ALL: False, ort.GraphOptimizationLevel.ORT_DISABLE_ALL: True}


# ---- every form against the kernel ------------------------------------------------------------------
REGIONS = [(None, 1), (None, -2), (0, None), (3, None), (-1, 2), (2, -1), (0, 1), (4, 4 + 1)]


def _dml_model(et: int, value, begin, end, with_x: bool, x_shape, out_shape, runtime_k: bool) -> onnx.ModelProto:
    dt = ALL_TYPES[et]
    attrs = {"value": numpy_helper.from_array(np.array([value], dt)), "value_data_type": int(
        dmlgraph_dtype(et))}
    if begin is not None:
        attrs["begin"] = begin
    if end is not None:
        attrs["end"] = end
    ins, inputs, inits = [], [], []
    if with_x:
        ins.append("x")
        inputs.append(h.make_tensor_value_info("x", et, x_shape))
    else:
        ins.append("")
    if out_shape != x_shape or not with_x:
        ins.append("shape")
        inits.append(numpy_helper.from_array(np.array(out_shape, np.int64), "shape"))
    else:
        ins.append("")
    if runtime_k:
        ins.append("k")
        inputs.append(h.make_tensor_value_info("k", T.INT64, []))
    while ins and not ins[-1]:
        ins.pop()
    node = h.make_node("DiagonalMatrix1", ins, ["y"], domain=onnx_io.DOMAIN, **attrs)
    g = h.make_graph([node], "g", inputs, [h.make_tensor_value_info("y", et, out_shape)], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 18), h.make_opsetid(onnx_io.DOMAIN, 1)], ir_version=10)


def dmlgraph_dtype(et: int) -> int:
    from dmlgraph.ir.dtypes import DmlDataType
    return int(DmlDataType.from_onnx(et))


def _data(dt, shape, seed=0) -> np.ndarray:
    if dt in UINT:
        return np.resize(_specials(dt).reshape(-1), int(np.prod(shape))).reshape(shape)
    if dt == np.bool_:
        return np.random.default_rng(seed).random(shape) < 0.5
    return np.random.default_rng(seed).integers(0, 100, shape).astype(dt)


def _standard_nodes(model: onnx.ModelProto) -> int:
    return sum(n.op_type not in ("Constant",) for n in model.graph.node)


CASES = []
for _et in (T.FLOAT, T.DOUBLE, T.FLOAT16, T.INT32, T.INT64, T.BOOL, T.INT8, T.UINT8, T.UINT16):
    for _b, _e in REGIONS:
        for _with_x in (True, False):
            for _value in ((0, 1, -0.0, 7) if _et in (T.FLOAT, T.DOUBLE, T.FLOAT16) else
                           (0, 1) if _et == T.BOOL else (0, 1, 5)):
                CASES.append((_et, _b, _e, _with_x, _value))


def _signed_zero_form(et, begin, end, with_x, value) -> bool:
    """A form that turns the data's -0.0 into +0.0 without --exact: a float fill outside a window."""
    return et in (T.FLOAT, T.DOUBLE, T.FLOAT16) and with_x and begin is not None and end is not None \
        and begin > end and value not in (0, -0.0)


def _loose_form(et, begin, end, with_x, value) -> bool:
    """Not bit-exact without --exact: the signed-zero forms, and float16 data (Trilu and Where change
    its NaN payloads)."""
    return _signed_zero_form(et, begin, end, with_x, value) or (et == T.FLOAT16 and with_x)


def _nan_payload(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Where `got` is a NaN of `want`'s sign where `want` is a NaN with another payload (float16
    through onnxruntime's Trilu and Where: a signaling NaN comes out quiet, 0x7c01 -> 0x7e01, and
    at some positions with the payload dropped, 0xfd01 -> 0xfe00)."""
    return np.isnan(want) & np.isnan(got) & (np.signbit(want) == np.signbit(got))


@pytest.mark.parametrize("et,begin,end,with_x,value,exact_only",
                         [(*c, True) for c in CASES] + [(*c, False) for c in CASES if _loose_form(*c)])
def test_portable_form_is_the_kernel_bit_for_bit(et, begin, end, with_x, value, exact_only):
    """Bit for bit under --exact; without it, also bit for bit but for the -0.0 of the data that a
    window fill's Where turns into +0.0, and float16 data's NaN payloads (a NaN stays a NaN of its
    sign; the rewrite then says it is not bit-exact)."""
    dt = ALL_TYPES[et]
    loose = not exact_only and _loose_form(et, begin, end, with_x, value)
    for x_shape, out_shape, runtime_k in (([5, 7], [5, 7], False), ([2, 1, 7], [2, 5, 7], False),
                                          ([4, 6], [4, 6], True)):
        if not with_x:
            x_shape = out_shape
        model = _dml_model(et, value, begin, end, with_x, x_shape, out_shape, runtime_k)
        result = pipeline.lower(model, pipeline.Options(allow_growth=True, exact_only=exact_only), "onnx")
        out = result.model
        assert not any(n.domain == onnx_io.DOMAIN for n in out.graph.node)
        if not exact_only and et == T.FLOAT16 and not np.signbit(value):  # (float32's forms, not the pseudocode)
            assert not any(n.op_type == "GatherElements" for n in out.graph.node)
        session = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
        for k in ((0,) if not runtime_k else (0, 2, -3, 2**62, -2**63)):
            feeds = {}
            if with_x:
                feeds["x"] = _data(dt, tuple(x_shape), seed=k % 7)
                if dt in (np.float32, np.float64):
                    feeds["x"].reshape(-1)[::3] = -0.0
            if runtime_k:
                feeds["k"] = np.array(k, np.int64)
            got = session.run(None, feeds)[0]
            want = dmlgraph.run(model, feeds)["y"]  # the DML node on dmlgraph's kernel (bounds bound as DML does)
            what = f"{dt.__name__} [{begin}, {end}) value {value!r} x {x_shape} -> {out_shape} k {k}"
            assert got.shape == want.shape, what
            if loose:
                flipped = (_bits(got) != _bits(want)).any(-1)
                signed = (want == 0) & np.signbit(want) & ~np.signbit(got) & (got == 0)  # -0.0 became +0.0
                if not _signed_zero_form(et, begin, end, with_x, value):
                    signed[:] = False
                quiet = _nan_payload(got, want) if dt == np.float16 else np.zeros_like(flipped)
                assert not (flipped & ~signed & ~quiet).any(), what
            else:
                assert (_bits(got) == _bits(want)).all(), what


def test_forms_take_the_fewest_nodes():
    """One-sided Value 0 on data: one Trilu; a generator: ConstantOfShape + Trilu (EyeLike: one
    more than nothing); Value on data: a band and a Where."""
    def nodes(*args) -> list[str]:
        m = pipeline.lower(_dml_model(*args), pipeline.Options(allow_growth=True), "onnx").model
        return [n.op_type for n in m.graph.node]
    assert nodes(T.FLOAT, 0.0, None, 1, True, [5, 7], [5, 7], False) == ["Trilu"]
    # k + 2, clipped first: k here is a graph input, any int64 (a k from Shape reads is not clipped)
    assert nodes(T.BOOL, False, 3, None, True, [5, 7], [5, 7], True) == ["Clip", "Add", "Trilu"]
    assert nodes(T.FLOAT, 0.0, 2, -1, True, [5, 7], [5, 7], False) == ["Trilu", "Trilu"]  # inverted: two Trilus
    assert nodes(T.INT64, 0, -1, 2, True, [5, 7], [5, 7], False) == ["Trilu", "Trilu", "Add"]
    assert nodes(T.FLOAT, 1.0, 0, 1, False, [5, 7], [5, 7], False) == ["ConstantOfShape", "EyeLike"]
    assert nodes(T.FLOAT, 3.0, None, 1, False, [5, 7], [5, 7], False) == ["ConstantOfShape", "Trilu"]
    assert nodes(T.FLOAT, -np.inf, 1, None, True, [2, 5, 7], [2, 5, 7], False) == ["ConstantOfShape", "Trilu",
                                                                                   "Where"]


def test_an_eyelike_writes_only_the_attributes_that_differ_from_its_defaults():
    """k 0 and a dtype equal to its input's (the float zeros it reads) go unwritten; an off
    diagonal or another type is written (the values are pinned bit for bit above)."""
    def attrs(et: int, begin: int) -> dict:
        m = pipeline.lower(_dml_model(et, 1, begin, begin + 1, False, [5, 7], [5, 7], False),
                           pipeline.Options(allow_growth=True), "onnx").model
        (eye,) = [n for n in m.graph.node if n.op_type == "EyeLike"]
        return {a.name: h.get_attribute_value(a) for a in eye.attribute}
    assert attrs(T.FLOAT, 0) == {}
    assert attrs(T.FLOAT, -2) == {"k": -2}
    assert attrs(T.INT64, 3) == {"k": 3, "dtype": T.INT64}


def test_each_site_counts_its_mask_part_and_the_select_applying_it():
    """The report counts, per site, the mask part (the band) and the whole site (with the select
    that applies it to the data, where the model had its own select); size plumbing (k's Clip/Add)
    and constants count in neither."""
    def counts(*args, exact_only: bool = False) -> tuple[int, int, list[str]]:
        g = onnx_io.import_model(_dml_model(*args))
        ((name, nodes),) = onnx_io.site_nodes(g, exact_only).items()
        (dml,) = [n for n in g.nodes.values() if isinstance(n, DmlNode)]
        assert dml.portable_nodes is not None
        return (*dml.portable_nodes, [n.op_type for n in nodes if n.op_type != "Constant"])
    assert counts(T.FLOAT, 0.0, None, 1, True, [5, 7], [5, 7], False)[:2] == (1, 1)  # Trilu(X): no select
    assert counts(T.BOOL, False, 3, None, True, [5, 7], [5, 7], True) == (1, 1, ["Clip", "Add", "Trilu"])
    assert counts(T.INT64, 0, -1, 2, True, [5, 7], [5, 7], False)[:2] == (3, 3)
    assert counts(T.FLOAT, 3.0, None, 1, False, [5, 7], [5, 7], False)[:2] == (2, 2)  # a generator
    assert counts(T.FLOAT, -np.inf, 1, None, True, [2, 5, 7], [2, 5, 7], False)[:2] == (2, 3)
    # -inf outside a window (band_w2): the window, X in Where's true branch (its -0.0 becomes +0.0) ...
    assert counts(T.FLOAT, -np.inf, 3, -2, True, [2, 5, 7], [2, 5, 7], False) == \
        (3, 4, ["ConstantOfShape", "Trilu", "Trilu", "Where"])
    # ... and under --exact the condition is two triangles, X in Where's false branch
    assert counts(T.FLOAT, -np.inf, 3, -2, True, [2, 5, 7], [2, 5, 7], False, exact_only=True) == \
        (4, 5, ["ConstantOfShape", "Trilu", "Trilu", "Or", "Where"])
    # float16 data: the float32 forms (NaN payloads change); under --exact the pseudocode
    assert counts(T.FLOAT16, 7.0, 1, None, True, [5, 7], [5, 7], False) == (2, 3, ["ConstantOfShape", "Trilu", "Where"])
    mask, site, ops = counts(T.FLOAT16, 7.0, 1, None, True, [5, 7], [5, 7], False, exact_only=True)
    assert 0 < mask < site and "GatherElements" in ops


@pytest.mark.parametrize("exact_only", [False, True])
def test_a_float16_padding_fill_folds_into_one_where_bit_for_bit(exact_only):
    """X = Where(P, 0, lowest) in float16 (the padding rules' form), banded with Value lowest: the
    portable form is `Where(Trilu(P), 0, lowest)`, bit-exact even under --exact (its branches are
    two constants: no data bits pass onnxruntime's float16 Where). Float16 took the pseudocode's
    stacked copy before, and a held-out gemma3 declined both its sites for growth."""
    lowest = np.finfo(np.float16).min
    value = {"value": numpy_helper.from_array(np.array([lowest], np.float16)),
             "value_data_type": int(dmlgraph_dtype(T.FLOAT16)), "begin": 1}
    nodes = [h.make_node("Where", ["p", "zero", "low"], ["x"]),
             h.make_node("DiagonalMatrix1", ["x"], ["y"], domain=onnx_io.DOMAIN, **value)]
    inits = [numpy_helper.from_array(np.array(0, np.float16), "zero"),
             numpy_helper.from_array(np.array(lowest, np.float16), "low")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("p", T.BOOL, [2, 5, 7])],
                     [h.make_tensor_value_info("y", T.FLOAT16, [2, 5, 7])], inits)
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 18), h.make_opsetid(onnx_io.DOMAIN, 1)], ir_version=10)
    out = pipeline.lower(model, pipeline.Options(allow_growth=True, exact_only=exact_only), "onnx").model
    assert [n.op_type for n in out.graph.node] == ["Trilu", "Where"]
    p = np.random.default_rng(0).random((2, 5, 7)) < 0.7
    got = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"p": p})[0]
    assert (_bits(got) == _bits(dmlgraph.run(model, {"p": p})["y"])).all()


# ---- the corpus: nothing grows ------------------------------------------------------------------------
# The one kind of site whose mask part takes 4 (docs/portable.md, "Two-sided bands"): a float fill on
# data outside a window (band_w2).
FOUR_NODE_MASKS = {"band_w2_dynamo", "band_w2_ts"}


@pytest.mark.parametrize("path", CORPUS, ids=[os.path.relpath(p, os.path.join(ROOT, "models")) for p in CORPUS])
def test_corpus_model_never_grows(path):
    source = onnx.load(path, load_external_data=False)
    for target in ("dml", "onnx"):
        result = dmlgraph.optimize(path, target=target)
        out = result.model
        assert costs.growth(source, out) is None, f"--target {target}: {costs.growth(source, out)}"
        kept = {t.name for t in out.graph.initializer}
        removed = [t for t in source.graph.initializer if t.name not in kept and len(t.dims) >= 2]  # stored masks
        # (On dml a stored mask becomes one DML node; on onnx nodes never grow: nanogpt_dynamo.)
        assert costs.all_nodes(out) <= costs.all_nodes(source) + (len(removed) if target == "dml" else 0)
        assert out.ByteSize() <= source.ByteSize() + costs.GROWTH_ALLOWANCE
        props = {p.key: p.value for p in out.metadata_props}
        if sum(result.counts.values()):
            assert props["dmlgraph.version"] == dmlgraph.__version__ and props["dmlgraph.target"] == target
            assert props["dmlgraph.feature_level"] == "5_1"
            assert json.loads(props["dmlgraph.rewrites"]) == {k: v for k, v in result.counts.items() if v}
        for d in result.declined:
            assert "would grow" not in d.reason or target == "onnx" or "dml" in d.reason
    # The mask part of each site the dml target lowered, as the portable target writes it.
    lowered = dmlgraph.optimize(path, target="dml", allow_growth=True).model
    g = onnx_io.import_model(lowered)
    dml = {n.outputs[0].name: n for n in g.nodes.values() if isinstance(n, DmlNode)}
    for name, nodes in onnx_io.site_nodes(g).items():
        mask, site = dml[name].portable_nodes  # type: ignore[misc]
        ops = [x.op_type for x in nodes]
        assert site - mask <= 1, f"{name}: {ops}"  # (one select at most)
        assert mask <= 3 or (mask == 4 and os.path.basename(path)[:-5] in FOUR_NODE_MASKS), f"{name}: {ops}"


KV_DYNAMO = ["bloom_kv_dynamo", "gemma2_sw4_kv_dynamo", "gpt2_kv_dynamo", "gpt_neox_kv_dynamo", "llama_kv_dynamo",
             "mistral_sw4_kv_dynamo", "opt_kv_dynamo", "phi3_kv_dynamo", "qwen2_mixed_sw4_kv_dynamo"]


@pytest.mark.parametrize("target", ["dml", "onnx"])
@pytest.mark.parametrize("name", KV_DYNAMO)
def test_kv_decoders_lower_without_growing(name, target):
    """The dynamo exporter names the padding mask's length "past_sequence + sequence"; the band's is
    read as Shape(past) + Shape(input_ids). Read as that one name, the broadcast of the two is
    settled without an "is this dim 1" chain, so the lowering no longer grows the model (it was
    declined whole, +3 or +4 nodes) and every saved input set gives onnxruntime's bits."""
    path = os.path.join(ROOT, "models", f"{name}.onnx")
    r = dmlgraph.optimize(path, target=target)
    assert r.rewrites and not [d for d in r.declined if d.reason.startswith("not written")]
    assert r.after["nodes"] <= r.before["nodes"]
    assert not [n for n in r.model.graph.node if n.name.endswith("__is_one")]
    if target == "onnx":
        for f in sorted(glob.glob(os.path.join(ROOT, "models", "inputs", name, "*.npz"))):
            feeds = dict(np.load(f))
            want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
            got = ort.InferenceSession(r.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
            assert all(a.shape == b.shape and a.tobytes() == b.tobytes() for a, b in zip(want, got)), f



@pytest.mark.parametrize("names_its_ones", [False, True])
@pytest.mark.parametrize("target", ["dml", "onnx"])
def test_a_padding_of_a_made_up_batch_dim_is_sized_where_it_traces(target, names_its_ones):
    """The dynamo padding (`test_own_sizes._gathered_padding`) with the Range lengths declared
    and the GatherND output not (value_info with dims made unknown: gemma2_sw4_kv_dynamo's
    dims_unknown mutant): inference names the padding's batch `unk__N`, which no input has. The
    And's broadcast is settled by names but for that one, which `DimKeys` traces to
    attention_mask's axis 0: read there, no "is this dim 1" chain, and the Expand to the model's
    target is the band as it is (before: declined on both targets, "would add 2 / 4 nodes").
    `names_its_ones`: every static dim of the value_info a name of its own, each declaration twice
    (mistral_sw4_kv_dynamo_slim's dims_symbolic mutant): the padding is declared
    [batch, n1, n2, past + sequence], which inference keeps; its 1s are sized by `DimKeys`, not by
    the names (before: the And's broadcast did not settle, the same declines)."""
    from test_own_sizes import _gathered_padding

    model = _gathered_padding()
    model.graph.value_info.extend([h.make_tensor_value_info("kv", T.INT64, ["past + sequence"]),
                                   h.make_tensor_value_info("qp", T.INT64, ["sequence"])])
    if names_its_ones:
        model = mutations.symbolic_dims(onnx.shape_inference.infer_shapes(model, data_prop=True), 0)
        model.graph.value_info.extend([onnx.ValueInfoProto.FromString(vi.SerializeToString())
                                       for vi in model.graph.value_info])  # (onnxslim declares twice)
    r = dmlgraph.optimize(model, target=target)
    assert r.counts["mask_view"] == 1 and not r.declined, [d.reason for d in r.declined]
    assert not [n for n in r.model.graph.node if n.op_type == "Equal"]
    rng = np.random.default_rng(1)
    for past, seq in ((0, 5), (4, 3), (6, 1)):
        mask = np.ones((2, past + seq), np.int64)
        mask[1, :3] = 0
        feeds = {"input_ids": np.zeros((2, seq), np.int64), "attention_mask": mask,
                 "past_key": np.zeros((2, 1, past, 4), np.float32),
                 "scores": rng.standard_normal((2, 1, seq, past + seq)).astype(np.float32)}
        if target == "dml":
            assert dmlgraph.validate(model, r, feeds, exact=True).ok
            continue
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        got = ort.InferenceSession(r.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        assert all(a.shape == b.shape and a.tobytes() == b.tobytes() for a, b in zip(want, got))

TS_DECODERS = ["bloom_kv_ts", "clip_text_ts", "gpt2_kv_ts", "t5_decoder_kv_ts"]


@pytest.mark.parametrize("name", TS_DECODERS)
def test_torchscript_padding_expands_to_the_models_own_sizes(name):
    """The TorchScript decoders expand `mask & padding` to the model's own `expand` sizes. The
    padding's portable Expand reads those sizes as they are: Expand's own broadcast with the
    padding gives what the rules' "is this dim 1" chain computed (its matrix entries are proved the
    band's by tracing both to the same Shape reads, not by dim names), and Trilu's k is the model's
    own 0-D size read (no Gather + Reshape of ours beside it). Every saved input set: the
    original's bits."""
    path = os.path.join(ROOT, "models", f"{name}.onnx")
    source = onnx.load(path, load_external_data=False)
    model = dmlgraph.optimize(path, target="onnx").model
    made = {o: n for n in model.graph.node for o in n.output}
    ones = {t.name for t in model.graph.initializer if numpy_helper.to_array(t).reshape(-1).tolist() == [1]}
    for n in model.graph.node:
        if n.op_type == "Expand" and n.input[1] in made:
            chain = made[n.input[1]]
            is_one = made.get(chain.input[0]) if chain.op_type == "Where" else None
            assert not (is_one is not None and is_one.op_type == "Equal" and is_one.input[1] in ones), n.output
    assert not [n for n in model.graph.node if n.output[0].endswith("__scalar")]
    assert len(model.graph.node) < len(source.graph.node)
    for f in sorted(glob.glob(os.path.join(ROOT, "models", "inputs", name, "*.npz"))):
        feeds = dict(np.load(f))
        want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
        got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        assert all(a.shape == b.shape and a.tobytes() == b.tobytes() for a, b in zip(want, got)), f


def test_entry_keys_read_sizes_by_where_they_come_from():
    """Two sizes are the same when they read the same value's axis: not when their names agree."""
    from dmlgraph.io import onnx_io as io
    x = h.make_tensor_value_info("x", T.FLOAT, ["n", "n"])
    y = h.make_tensor_value_info("y", T.FLOAT, ["n", 3])
    nodes = [h.make_node("Shape", ["x"], ["sx"]), h.make_node("Shape", ["y"], ["sy"]),
             h.make_node("Gather", ["sx", "i0"], ["x0"], axis=0), h.make_node("Gather", ["sx", "i1"], ["x1"], axis=0),
             h.make_node("Gather", ["sy", "i0"], ["y0"], axis=0), h.make_node("Add", ["x0", "y0"], ["s1"]),
             h.make_node("Add", ["y0", "x0"], ["s2"]), h.make_node("Concat", ["s1", "x1", "sy"], ["v"], axis=0),
             h.make_node("Identity", ["v"], ["out"])]
    graph = h.make_graph(nodes, "g", [x, y], [h.make_tensor_value_info("out", T.INT64, [None])],
                         [numpy_helper.from_array(np.array([0], np.int64), "i0"),
                          numpy_helper.from_array(np.array([1], np.int64), "i1")])
    g = io.import_model(h.make_model(graph, opset_imports=[h.make_opsetid("", 18)]))
    keys = portable.entry_keys(g, g.values["v"])
    assert keys is not None and len(keys) == 4
    assert keys[0] == portable.entry_keys(g, g.values["s2"])[0]  # (x0 + y0 is y0 + x0)
    assert keys[1] != keys[2] and keys[1] == ("dim", "x", 1) and keys[3] == ("c", 3)  # (x's n is not y's n)


def test_a_sum_of_sizes_reads_as_the_exporters_name_in_either_order():
    from dmlgraph.passes.broadcast import sum_name
    assert sum_name("past_sequence", "sequence") == sum_name("sequence", "past_sequence") == "past_sequence + sequence"
    assert sum_name("a + c", "b") == "a + b + c"


def _trilu_model(upper_and_lower: bool) -> onnx.ModelProto:
    nodes = [h.make_node("Trilu", ["x"], ["a"], upper=0)]
    if upper_and_lower:
        nodes.append(h.make_node("Trilu", ["a", "k"], ["y"], upper=1))
    else:
        nodes.append(h.make_node("Identity", ["a"], ["y"]))  # (folded: the Trilu writes y since round 9)
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, ["b", "n", "n"])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["b", "n", "n"])],
                     [numpy_helper.from_array(np.array(-2, np.int64), "k")])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


@pytest.mark.parametrize("two_sided", [False, True])
def test_the_summary_says_which_sites_are_one_trilu(two_sided):
    """optimize's report and inspect's totals count the sites the portable output writes as one
    Trilu (one DIAGONAL_MATRIX1 on onnxruntime's DML provider) and name the form of the others."""
    m = _trilu_model(two_sided)
    r = dmlgraph.optimize(m, target="onnx", allow_growth=True)
    ops = [n.op_type for n in r.model.graph.node]
    n = 2 if two_sided else 1
    want = {"sites": 1, "one_operator": 0 if two_sided else 1,
            "forms": {"two Trilus (a band bounded on both sides)" if two_sided else "one Trilu": 1},
            "mask_nodes": {str(n): 1}, "site_nodes": {str(n): 1},
            "per_site": [{"output": "y", "form": "two Trilus (a band bounded on both sides)" if two_sided
                          else "one Trilu", "mask_nodes": n, "site_nodes": n}]}
    assert r.report["portable"] == want and ops.count("Trilu") == (2 if two_sided else 1)
    assert dmlgraph.inspect(m, target="onnx").totals["portable"] == want
    assert "portable" not in dmlgraph.optimize(m, target="dml", allow_growth=True).report


@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_an_arithmetic_mask_is_written_as_its_arithmetic(op):
    """`mask_arith` (equal for finite X) is written back as the Add it replaced, with a Trilu band,
    not a Where (which onnxruntime runs 1.5x slower at a 1024-token prefill): the same bits as the
    original for finite data; a Mul by a 0/1 band is one Trilu of X (equal values)."""
    lowest = np.finfo(np.float32).min
    fill = np.array(lowest if op == "Add" else 1.0, np.float32)
    nodes = [h.make_node("Shape", ["x"], ["s"], start=-2),
             h.make_node("ConstantOfShape", ["s"], ["full"], value=numpy_helper.from_array(fill.reshape(1))),
             h.make_node("Trilu", ["full", "one"], ["band"], upper=1 if op == "Add" else 0),
             h.make_node(op, ["x", "band"], ["y"])]
    # (x's axes named apart: ["b", "n", "n"] would be a claim the band's sizes read, docs/semantics.md)
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, ["b", "n", "m"])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["b", "n", "m"])],
                     [numpy_helper.from_array(np.array(1, np.int64), "one")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    r = dmlgraph.optimize(m, target="onnx", allow_growth=True)
    assert r.counts["mask_arith"] == 1
    ops = [n.op_type for n in r.model.graph.node]
    assert "Where" not in ops and ops.count("Trilu") == 1 and ("Add" in ops) == (op == "Add")  # Mul: Trilu(X)
    x = np.random.default_rng(0).standard_normal((2, 7, 7)).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = ort.InferenceSession(r.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    if op == "Add":
        assert want.tobytes() == got.tobytes()
    else:  # X * 0 is -0.0 for a negative X where Trilu writes 0.0: equal values, as the rule states
        assert np.array_equal(want, got) and not want.tobytes() == got.tobytes()
    assert dmlgraph.validate(m, r, {"x": x}).ok


def test_a_sum_of_two_biases_keeps_its_negative_zeros():
    """Two transformers biases `(1 - m.float()) * finfo.min` summed (causal + another band): the
    lowered Add is an exact `mask_arith` node (its X the constant -0.0 that `0 * finfo.min` makes,
    its Value -inf). Written as the arithmetic it replaced, `-0.0 + Trilu(-inf)`, the kept
    region came out +0.0 (0.0 + -0.0), and x + bias then lost x's -0.0 (found by the widened
    fuzzer of forms: the bias domain, an application in a Scan body); only an inexact node takes
    the arithmetic form now, this one a Where."""
    lowest = np.finfo(np.float32).min
    nodes = [h.make_node("Shape", ["x"], ["matrix"])]
    ones = numpy_helper.from_array(np.ones(1, np.float32))
    for b in ("a", "b"):
        nodes += [h.make_node("ConstantOfShape", ["matrix"], [f"{b}_ones"], value=ones),
                  h.make_node("Trilu", [f"{b}_ones", "k"], [f"{b}_keep"], upper=1),
                  h.make_node("Sub", ["one", f"{b}_keep"], [f"{b}_inv"]), h.make_node("Mul", [f"{b}_inv", "low"], [b])]
    nodes.append(h.make_node("Add", ["a", "b"], ["biases"]))
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [3, 3])],
                     [h.make_tensor_value_info("biases", T.FLOAT, [3, 3])],
                     [numpy_helper.from_array(np.array(1, np.int64), "k"), numpy_helper.from_array(np.float32(1), "one"),
                      numpy_helper.from_array(np.float32(lowest), "low")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 18)], ir_version=10)
    r = dmlgraph.optimize(m, target="onnx")
    assert r.rewrites and all(w.exact for w in r.rewrites) and r.counts["mask_arith"] >= 1
    x = np.zeros((3, 3), np.float32)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = ort.InferenceSession(r.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.signbit(want[0, 1]) and want.tobytes() == got.tobytes()


def test_data_plus_a_bias_of_lowest_and_minus_inf_is_not_written_as_an_add():
    """x + ((1 - eye) * finfo.min + Where(tril(k=-1), 0, finfo.min)): the bias is finfo.min on and
    below the diagonal, -inf above, so the lowered node is a generator of two constants (X the
    folded finfo.min of x + finfo.min, Value -inf). Its arithmetic form `X + Trilu(band)` computed
    finfo.min + -inf and -inf + finfo.min and wrote -inf everywhere (found by the widened fuzzer of
    forms: the bias domain in an If branch); a constant X takes the Where form now."""
    lowest = np.finfo(np.float32).min
    c = numpy_helper.from_array
    nodes = [h.make_node("Shape", ["x"], ["shape"]), h.make_node("Slice", ["shape", "a2", "a4"], ["matrix"]),
             h.make_node("ConstantOfShape", ["matrix"], ["zeros"], value=c(np.zeros(1, np.float32))),
             h.make_node("EyeLike", ["zeros"], ["eye"]), h.make_node("Sub", ["one", "eye"], ["inv"]),
             h.make_node("Mul", ["inv", "low"], ["a"]),
             h.make_node("ConstantOfShape", ["matrix"], ["ones"], value=c(np.ones(1, np.float32))),
             h.make_node("Trilu", ["ones", "km1"], ["tri"], upper=0), h.make_node("Cast", ["tri"], ["keep"], to=T.BOOL),
             h.make_node("Where", ["keep", "zero", "low"], ["b"]),
             h.make_node("Add", ["a", "b"], ["biases"]), h.make_node("Add", ["x", "biases"], ["y"])]
    inits = [c(np.array([2]), "a2"), c(np.array([4]), "a4"), c(np.array(-1), "km1"), c(np.float32(1), "one"),
             c(np.float32(0), "zero"), c(np.float32(lowest), "low")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 2, "S", "S"])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 2, "S", "S"])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 18)], ir_version=10)
    r = dmlgraph.optimize(m, target="onnx")
    assert r.counts["mask_arith"] == 1 and "Add" not in [n.op_type for n in r.model.graph.node]
    x = np.random.default_rng(0).standard_normal((1, 2, 4, 4)).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = ort.InferenceSession(r.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.isneginf(want[0, 0, 0, 1]) and want[0, 0, 1, 0] == lowest and np.array_equal(want, got)


@pytest.mark.parametrize("claimed", [False, True])
def test_a_band_read_off_x_declares_xs_dims(claimed):
    """A band `ConstantOfShape(Shape(x, start=-2))` gets x's declared last two dims as value_info,
    so onnxruntime's planner can prove `Add(x, band)` has x's size and run it in place (one buffer
    the size of x less: docs/benchmarks.md, branch `peakmem`); not where two inputs name a dim alike."""
    nodes = [h.make_node("Shape", ["x"], ["s"], start=-2),
             h.make_node("ConstantOfShape", ["s"], ["full"],
                         value=numpy_helper.from_array(np.array([np.finfo(np.float32).min], np.float32))),
             h.make_node("Trilu", ["full", "one"], ["band"], upper=1),
             h.make_node("Add", ["x", "band"], ["y"])]
    inputs = [h.make_tensor_value_info("x", T.FLOAT, ["b", "n", "m"])]
    if claimed:
        inputs.append(h.make_tensor_value_info("other", T.FLOAT, ["n"]))
        nodes.append(h.make_node("Identity", ["other"], ["other_out"]))
    outputs = [h.make_tensor_value_info("y", T.FLOAT, ["b", "n", "m"])]
    outputs += [h.make_tensor_value_info("other_out", T.FLOAT, ["n"])] if claimed else []
    g = h.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(np.array(1, np.int64), "one")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    r = dmlgraph.optimize(m, target="onnx", allow_growth=True)
    assert r.counts["mask_arith"] == 1
    fill = next(n.output[0] for n in r.model.graph.node if n.op_type == "ConstantOfShape")
    declared = {vi.name: [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]
                for vi in r.model.graph.value_info}
    assert declared.get(fill) == (None if claimed else ["n", "m"])
    onnx.checker.check_model(r.model, full_check=True)
    x = np.random.default_rng(0).standard_normal((2, 5, 7)).astype(np.float32)
    feeds = {"x": x} | ({"other": np.zeros(3, np.float32)} if claimed else {})
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(r.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(want, got))


@pytest.mark.parametrize("name", ["split_concat_tril_ts", "split_concat_tril_dynamo"])
def test_a_band_with_sizes_from_the_broadcast_is_a_matrix(name):
    """The node's sizes are X's leading sizes and the band's matrix (`build_matrix_of` of a
    broadcast whose mask was padded with ones): the band is the [H, W] matrix, broadcast by the
    Where, not a ones tensor of the whole output (3x the work at 1 thread, measured 1.3x the
    original), and the plumbing that computed the leading sizes dies."""
    path = os.path.join(ROOT, "models", f"{name}.onnx")
    r = dmlgraph.optimize(path, target="onnx", allow_growth=True)  # (by default declined: test_site_kernels.py)
    inferred = onnx.shape_inference.infer_shapes(r.model)
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in inferred.graph.value_info}
    trilus = [n for n in r.model.graph.node if n.op_type == "Trilu"]
    assert trilus and all(ranks.get(n.output[0]) == 2 for n in trilus)
    assert not [n for n in r.model.graph.node if n.op_type == "Equal"]
    for f in sorted(glob.glob(os.path.join(ROOT, "models", "inputs", name, "*.npz"))):
        feeds = dict(np.load(f))
        want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
        got = ort.InferenceSession(r.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        assert all(a.shape == b.shape and a.tobytes() == b.tobytes() for a, b in zip(want, got)), f


@pytest.mark.parametrize("lead", [1, 2])
def test_sizes_broadcast_from_x_give_a_matrix_band_only_when_the_lead_is_xs(lead):
    """Sizes `Where(Equal(p, 1), Shape(X), p)` with p = [lead, 5, 7]: with lead 1 the output's
    leading size is X's, and the band is a [5, 7] matrix the Where broadcasts; with lead 2 it is
    not (X is [1, 5, 7], the output [2, 5, 7]), and the band must have the output's sizes."""
    nodes = [h.make_node("Shape", ["x"], ["sx"]),
             h.make_node("Concat", ["lead", "hw"], ["p"], axis=0),
             h.make_node("Equal", ["p", "one"], ["is_one"]),
             h.make_node("Where", ["is_one", "sx", "p"], ["sizes"]),
             h.make_node("DiagonalMatrix1", ["x", "sizes"], ["y"], domain=onnx_io.DOMAIN, begin=1,
                         value=numpy_helper.from_array(np.array([-np.inf], np.float32)),
                         value_data_type=dmlgraph_dtype(T.FLOAT))]
    inits = [numpy_helper.from_array(np.array([lead], np.int64), "lead"),
             numpy_helper.from_array(np.array([5, 7], np.int64), "hw"),
             numpy_helper.from_array(np.array([1], np.int64), "one")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 5, 7])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["b", 5, 7])], inits)
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 18), h.make_opsetid(onnx_io.DOMAIN, 1)], ir_version=10)
    out = pipeline.lower(model, pipeline.Options(allow_growth=True), "onnx").model
    ranks = {v.name: len(v.type.tensor_type.shape.dim)
             for v in onnx.shape_inference.infer_shapes(out).graph.value_info}
    assert [ranks.get(n.output[0]) for n in out.graph.node if n.op_type == "Trilu"] == [2 if lead == 1 else 3]
    x = _data(np.float32, (1, 5, 7))
    got = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    want = dmlgraph.run(model, {"x": x})["y"]
    assert got.shape == want.shape == (lead, 5, 7) and (_bits(got) == _bits(want)).all()


def test_an_opset_too_old_for_the_portable_forms_is_written_unchanged(tmp_path):
    """An opset-11 model (an older exporter's default): the portable target cannot write its forms
    there, so every site is declined with the reason and the input written; `dml` lowers it."""
    c = lambda name, v: numpy_helper.from_array(np.asarray(v), name)
    nodes = [h.make_node("Shape", ["x"], ["sh"]), h.make_node("Gather", ["sh", "zero"], ["n"], axis=0),
             h.make_node("Range", ["zero", "n", "one"], ["r"]), h.make_node("Unsqueeze", ["r"], ["rc"], axes=[1]),
             h.make_node("Less", ["r", "rc"], ["m"]), h.make_node("Where", ["m", "ninf", "x"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, ["s", "s"])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["s", "s"])],
                     [c("zero", np.int64(0)), c("one", np.int64(1)), c("ninf", np.float32(-np.inf))])
    src = str(tmp_path / "m.onnx")
    onnx.save(h.make_model(g, ir_version=10, opset_imports=[h.make_opsetid("", 11)]), src)
    portable_result = dmlgraph.optimize(src, target="onnx")
    assert not portable_result.rewrites and portable_result.declined
    assert all("opset 11" in d.reason for d in portable_result.declined if d.rule in ("mask_subgraph", "mask_where"))
    assert [n.op_type for n in portable_result.model.graph.node] == [n.op_type for n in nodes]
    assert dmlgraph.optimize(src, target="dml").rewrites


@pytest.mark.parametrize("exact", [False, True])
def test_a_window_fill_takes_three_mask_nodes_unless_exact(exact):
    """band_w2's -inf outside a window: `Where(window, X, -inf)` (mask part 3) by default, stated as
    not bit-exact (X's -0.0 in the window becomes +0.0, as onnxruntime's own Not/Where fusion does to
    the original); under --exact the Or of two triangles (4), bit-exact. Values equal either way."""
    path = os.path.join(ROOT, "models", "band_w2_ts.onnx")
    result = dmlgraph.optimize(path, target="onnx", exact=exact)
    sites = result.report["portable"]["per_site"]
    assert sites and {(s["mask_nodes"], s["site_nodes"]) for s in sites} == {(4, 5) if exact else (3, 4)}
    assert [r.exact for r in result.rewrites if r.rule == "mask_where"] == [exact]  # (the band's own: exact)
    assert all(r.exact for r in dmlgraph.optimize(path, target="dml", exact=exact).rewrites)  # the DML node is
    model = onnx.load(path)
    feeds = {i.name: np.random.default_rng(0).standard_normal(
        [d.dim_value or 6 for d in i.type.tensor_type.shape.dim]).astype(np.float32) for i in model.graph.input}
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(result.model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    for w, g in zip(want, got):
        assert np.array_equal(w, g, equal_nan=True)
        if exact:
            assert (_bits(w) == _bits(g)).all()


def test_a_graph_outputs_declared_shape_proves_nothing():
    """A stored band sliced at rows [start, start + S) applied by Where to x [1, 2, S, T], the output
    declared [1, 2, S, T]: the slice is empty for every S here, so onnxruntime's output has 0 rows
    at S 1 (the model breaks its own declaration). The portable Trilu must broadcast x into the
    node's sizes, not take the declaration as x's shape (it wrote [1, 2, 1, 5])."""
    c = numpy_helper.from_array
    nodes = [h.make_node("Shape", ["x"], ["sh"]), h.make_node("Gather", ["sh", "i2"], ["S"]),
             h.make_node("Gather", ["sh", "i3"], ["T"]), h.make_node("Add", ["start", "S"], ["end"]),
             h.make_node("Slice", ["buf", "start", "end", "ax0"], ["rows"]),
             h.make_node("Slice", ["rows", "zero", "T", "ax1"], ["mask"]),
             h.make_node("Where", ["mask", "x", "fill"], ["y"])]
    inits = [c(np.tril(np.ones((64, 64), bool)), "buf"), c(np.array([2]), "i2"), c(np.array([3]), "i3"),
             c(np.array([-2**62]), "start"), c(np.array([0]), "ax0"), c(np.array([1]), "ax1"),
             c(np.array([0]), "zero"), c(np.array(0, np.float32), "fill")]
    m = h.make_model(h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 2, "S", "T"])],
                                  [h.make_tensor_value_info("y", T.FLOAT, [1, 2, "S", "T"])], inits),
                     opset_imports=[h.make_opsetid("", 18)], ir_version=10)
    x = _data(np.float32, (1, 2, 1, 5))
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert want.shape == (1, 2, 0, 5)
    for exact in (False, True):
        r = dmlgraph.optimize(m, target="onnx", allow_growth=True, exact=exact)
        assert r.counts["mask_where"] == 1
        got = ort.InferenceSession(r.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        assert got.shape == want.shape
