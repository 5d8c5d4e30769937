"""Slice and Transpose of a band that holds data or moves at run time (passes/band_views.py): lowered,
bit for bit with onnxruntime on the original on both targets, at sizes around every bound; the rest
declined, named."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from test_apply import c, check, lower, model_of

from dmlgraph.ir.graph import DmlNode

BIG = 2**63 - 1
SIZES = (0, 1, 2, 3, 5)
# (starts, ends) of the last two axes: inside, from the end, past the end, empty, reversed, extreme
BOUNDS = [([0, 0], [BIG, BIG]), ([1, 0], [BIG, BIG]), ([0, 2], [BIG, 4]), ([-1, 0], [BIG, -1]),
          ([-3, -9], [-1, 2**62]), ([7, 1], [8, 3]), ([2, 3], [1, BIG]), ([-BIG - 1, 2], [BIG, -2])]
FLOATS = {T.FLOAT: np.float32, T.DOUBLE: np.float64, T.FLOAT16: np.float16}


def _data(dtype, shape, seed: int) -> np.ndarray:
    """Random values with -0.0, infinities and NaNs of odd payloads mixed in."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    flat = x.reshape(-1)
    u = flat.view(f"u{x.itemsize}")
    if flat.size:
        flat[::3] = -0.0
        flat[1::7] = np.inf
        u[2::5] = np.array(np.nan, dtype).view(u.dtype) | 0x5  # (a NaN with a payload)
    return x


def _band_nodes(source: str) -> tuple[list, list, list]:
    """A band [1, 1, L, L] over pad's L: causal (Range grids), or Trilu of ones with a run-time k."""
    inits = [c("one", np.int64(1)), c("zero", np.int64(0)), c("ax0", np.array([0])), c("ax1", np.array([1])),
             c("ax01", np.array([0, 1]))]
    nodes = [h.make_node("Shape", ["pad"], ["ps"]), h.make_node("Gather", ["ps", "one"], ["len"], axis=0)]
    if source == "trilu":
        nodes += [h.make_node("Unsqueeze", ["len", "ax0"], ["l1"]), h.make_node("Concat", ["l1", "l1"], ["ll"], axis=0),
                  h.make_node("ConstantOfShape", ["ll"], ["ones"], value=h.make_tensor("v", T.FLOAT, [1], [1.0])),
                  h.make_node("Trilu", ["ones", "k"], ["tri"], upper=0), h.make_node("Cast", ["tri"], ["b2"], to=T.BOOL),
                  h.make_node("Unsqueeze", ["b2", "ax01"], ["band"])]
        return nodes, inits, [h.make_tensor_value_info("k", T.INT64, [])]
    nodes += [h.make_node("Range", ["zero", "len", "one"], ["idx"]),
              h.make_node("Unsqueeze", ["idx", "ax0"], ["cols"]), h.make_node("Unsqueeze", ["idx", "ax1"], ["rows"]),
              h.make_node("LessOrEqual", ["cols", "rows"], ["b2"]), h.make_node("Unsqueeze", ["b2", "ax01"], ["band"])]
    return nodes, inits, []


def _model(source: str, data: str, elem: int = T.FLOAT, view: str = "slice", bounds: tuple | None = None,
           axes: tuple[int, int] = (-2, -1), static: int | None = None):
    """y = view(band applied to data): `data` "pad" (And with the padding: bool data), "x" (Where(band,
    x, fill): data of `elem`); the view a Slice of the last two axes (bounds graph inputs, or
    constants) or a Transpose."""
    nodes, inits, inputs = _band_nodes(source)
    inputs += [h.make_tensor_value_info("pad", T.INT64, [2, static] if static else ["B", "L"])]
    if data == "pad":
        nodes += [h.make_node("Cast", ["pad"], ["padb"], to=T.BOOL),
                  h.make_node("Unsqueeze", ["padb", "ax12"], ["p"]), h.make_node("And", ["band", "p"], ["m"])]
        inits.append(c("ax12", np.array([1, 2])))
        out_type = T.BOOL
    else:
        inputs.append(h.make_tensor_value_info("x", elem, [2, 2, static, static] if static else ["B", 2, "R", "C"]))
        nodes.append(h.make_node("Where", ["band", "x", "fill"], ["m"]))
        inits.append(c("fill", np.array(-3.5, FLOATS[elem])))
        out_type = elem
    if view == "slice":
        if bounds is not None:
            inits += [c("st", np.array(bounds[0])), c("en", np.array(bounds[1]))]
        else:
            inputs += [h.make_tensor_value_info("st", T.INT64, [2]), h.make_tensor_value_info("en", T.INT64, [2])]
        nodes.append(h.make_node("Slice", ["m", "st", "en", "axes"], ["y"]))
        inits.append(c("axes", np.array(axes)))
    else:
        nodes.append(h.make_node("Transpose", ["m"], ["y"], perm=[0, 1, 3, 2]))
    return model_of(nodes, inputs, [h.make_tensor_value_info("y", out_type, ["B", "H", "R", "C"])], inits)


def _feeds(source: str, data: str, elem: int, s: int, seed: int, k: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    f = {"pad": rng.integers(0, 2, (2, s)).astype(np.int64)}
    if data == "x":
        f["x"] = _data(FLOATS[elem], (2, 2, s, s), seed)
    if source == "trilu":
        f["k"] = np.array(k, np.int64)
    return f


def _ks(data: str) -> tuple[int, ...]:
    """Trilu's k, extremes included (onnx.reference, judging float data, cannot take +-2^63)."""
    big = 2**40 if data == "x" else BIG
    return 0, -2, 3, -big - 1, big


def _lowered(g, result) -> None:
    """y is made by one DIAGONAL_MATRIX1 node: the view went into it."""
    assert result.counts["mask_view"] >= 1, [m.reason for m in result.declined]
    assert [isinstance(n, DmlNode) for n in g.nodes.values() if n.outputs[0].name == "y"] == [True], \
        [m.reason for m in result.declined]


@pytest.mark.parametrize("source,data,elem", [("causal", "pad", None), ("causal", "x", T.FLOAT),
                                              ("causal", "x", T.DOUBLE), ("causal", "x", T.FLOAT16),
                                              ("trilu", "pad", None), ("trilu", "x", T.FLOAT)])
def test_slice_of_a_band_with_data_at_run_time_bounds(source, data, elem):
    model = _model(source, data, elem or T.FLOAT)
    g, result = lower(model)
    _lowered(g, result)
    feeds = []
    for s in SIZES:
        for i, (st, en) in enumerate(BOUNDS + [([-s, 0], [BIG, -s]), ([s - 1, -s], [s, BIG])]):
            for k in (_ks(data) if source == "trilu" else (0,)):
                f = _feeds(source, data, elem or T.FLOAT, s, 10 * s + i, k)
                feeds.append(dict(f, st=np.array(st), en=np.array(en)))
    check(model, g, feeds, reference=data == "x")


@pytest.mark.parametrize("source,data", [("causal", "pad"), ("causal", "x"), ("trilu", "pad"), ("trilu", "x")])
def test_transpose_of_a_band_with_data_mirrors_it(source, data):
    model = _model(source, data, view="transpose")
    g, result = lower(model)
    _lowered(g, result)
    feeds = [_feeds(source, data, T.FLOAT, s, s, k) for s in SIZES
             for k in (_ks(data) if source == "trilu" else (0,))]
    check(model, g, feeds, reference=data == "x")


@pytest.mark.parametrize("st,en", BOUNDS)
def test_slice_at_constant_bounds(st, en):
    """Constant bounds: a start >= 0 shifts the bounds statically at every size; one from the end reads
    the size at run time."""
    model = _model("causal", "pad", bounds=(st, en))
    g, result = lower(model)
    _lowered(g, result)
    check(model, g, [_feeds("causal", "pad", T.FLOAT, s, s) for s in SIZES])


def test_slice_with_a_step_is_declined_named():
    model = _model("causal", "pad")
    model.graph.node[-1].input.append("steps")
    model.graph.initializer.append(c("steps", np.array([1, 2])))
    _, result = lower(model)
    assert not result.counts["mask_view"]
    assert any("step other than 1" in (m.reason or "") for m in result.declined), [m.reason for m in result.declined]


@pytest.mark.parametrize("data", ["pad", "x"])
@pytest.mark.parametrize("axes", [(-2, -1), (0, -1), (-2, 1)])
def test_slice_of_a_static_band_and_of_its_batch_axes(data, axes):
    """Static sizes (the clamped starts and lengths are constants where the bounds are), and a batch
    axis sliced with a matrix axis (the data sliced alike, a broadcast axis left whole)."""
    for static in (None, 3):
        model = _model("causal", data, axes=axes, static=static)
        g, result = lower(model)
        _lowered(g, result)
        feeds = []
        for s in ((static,) if static else SIZES):
            for i, (st, en) in enumerate(BOUNDS):
                feeds.append(dict(_feeds("causal", data, T.FLOAT, s, 7 * s + i), st=np.array(st), en=np.array(en)))
        check(model, g, feeds, reference=data == "x")


@pytest.mark.parametrize("view", ["slice", "transpose"])
@pytest.mark.parametrize("source", ["causal", "trilu"])
def test_a_view_of_a_claimed_band(view, source):
    """x and pad both declare L: the band is applied by that claim and reads its mask's sizes at run
    time (`DmlNode.matrix`). The view moves them too; where the claim breaks (pad's L is 1, x's is
    not: the model broadcasts the mask's one row and column) the mask's sides of 1 stay and take no
    shift."""
    model = _model(source, "x", view=view)
    x = model.graph.input[-3 if view == "slice" else -1]
    assert x.name == "x"
    for i, name in ((2, "L"), (3, "L")):
        x.type.tensor_type.shape.dim[i].dim_param = name
    g, result = lower(model)
    _lowered(g, result)
    assert any(isinstance(n, DmlNode) and n.claimed for n in g.nodes.values())
    feeds = []
    for s, n in [(s, s) for s in SIZES] + [(3, 1), (2, 1), (0, 1)]:
        for i, (st, en) in enumerate(BOUNDS if view == "slice" else [([0], [0])]):
            for k in (_ks("x")[:3] if source == "trilu" else (0,)):
                f = _feeds(source, "x", T.FLOAT, n, 3 * s + i, k)
                f["x"] = _data(np.float32, (2, 2, s, s), 3 * s + i)
                if view == "slice":
                    f.update(st=np.array(st), en=np.array(en))
                feeds.append(f)
    check(model, g, feeds, reference=True)


@pytest.mark.parametrize("data", ["pad", "x"])
def test_slice_of_a_one_row_band_slices_its_row(data):
    """A band of one row [1, L] (a decode step) applied to data of its own shape: the data's row axis
    is 1 and not broadcast, so the slice takes it too (`[1:]` leaves no row). Found by the fuzzer of
    forms (seed 11) where a body's band took its data's shape."""
    nodes = [h.make_node("Shape", ["pad"], ["ps"]), h.make_node("Gather", ["ps", "one"], ["len"], axis=0),
             h.make_node("Unsqueeze", ["len", "ax0"], ["l1"]), h.make_node("Concat", ["o1", "l1"], ["shape"], axis=0),
             h.make_node("ConstantOfShape", ["shape"], ["ones"], value=h.make_tensor("v", T.FLOAT, [1], [1.0])),
             h.make_node("Trilu", ["ones", "k"], ["tri"], upper=0), h.make_node("Cast", ["tri"], ["b2"], to=T.BOOL),
             h.make_node("Unsqueeze", ["b2", "ax01"], ["band"])]
    inits = [c("one", np.int64(1)), c("ax0", np.array([0])), c("ax01", np.array([0, 1])), c("o1", np.array([1])),
             c("axes", np.array([-2, -1]))]
    inputs = [h.make_tensor_value_info("pad", T.INT64 if data == "x" else T.BOOL, [1, "L"]),
              h.make_tensor_value_info("k", T.INT64, []),
              h.make_tensor_value_info("st", T.INT64, [2]), h.make_tensor_value_info("en", T.INT64, [2])]
    if data == "x":
        inputs.append(h.make_tensor_value_info("x", T.FLOAT, [1, 2, 1, "L"]))
        nodes.append(h.make_node("Where", ["band", "x", "fill"], ["m"]))
        inits.append(c("fill", np.float32(-3.5)))
    else:
        nodes += [h.make_node("Unsqueeze", ["pad", "ax01"], ["p"]), h.make_node("And", ["band", "p"], ["m"])]
    nodes.append(h.make_node("Slice", ["m", "st", "en", "axes"], ["y"]))
    out = h.make_tensor_value_info("y", T.FLOAT if data == "x" else T.BOOL, ["B", "H", "R", "C"])
    model = model_of(nodes, inputs, [out], inits)
    g, result = lower(model)
    _lowered(g, result)
    feeds = []
    for n in (1, 2, 4):
        for i, (st, en) in enumerate(BOUNDS):
            for k in (-1, 0, 2):
                f = {"k": np.array(k), "st": np.array(st), "en": np.array(en)}
                if data == "x":
                    f.update(pad=np.ones((1, n), np.int64), x=_data(np.float32, (1, 2, 1, n), n + i))
                else:
                    f["pad"] = np.arange(n).reshape(1, n) % 2 == 0
                feeds.append(f)
    check(model, g, feeds, reference=data == "x")
