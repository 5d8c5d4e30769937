"""DxDispatch export and check.

Every export is validated against a JSON Schema written from DxDispatch's own `_schema.json`
(tests/data, provenance in its `$comment`), and every dispatch is recomputed here from its JSON
desc and input .npy by a transcription of the spec's formula that shares nothing with dmlgraph's
kernels, and compared bit for bit with expected/. For one-operator models expected/ is also
onnxruntime's output of the original model.
"""
from __future__ import annotations

import glob
import io
import json
import os
import pathlib
import shutil

import jsonschema
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from dmlgraph import pipeline
from dmlgraph.errors import DmlgraphError, UnsupportedError
from dmlgraph.ir.dtypes import DmlDataType, ScalarUnion
from dmlgraph.ir.ops import FeatureLevel
from dmlgraph.rewrite import Options
from dmlgraph.tools import cli, dxdispatch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
CORPUS = sorted(glob.glob(os.path.join(ROOT, "models", "*.onnx"))) + \
    [os.path.join(ROOT, "models", "synthetic", "causal_attention.onnx")]

with open(os.path.join(DATA, "dxdispatch_model.schema.json")) as _f:
    SCHEMA = json.load(_f)
jsonschema.Draft202012Validator.check_schema(SCHEMA)
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)

# ---- an independent reading of a DxDispatch DIAGONAL_MATRIX(1) dispatch ----------------------
_NP = {"FLOAT32": np.float32, "FLOAT16": np.float16, "FLOAT64": np.float64, "UINT8": np.uint8,
       "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16,
       "INT32": np.int32, "INT64": np.int64}
_WORDS = {"inf": np.inf, "-inf": -np.inf, "nan": np.nan}


def _float(v: float | int | str, dtype: type) -> np.generic:
    """ParseFloatingPointNumber: a JSON number, or inf/-inf/nan; the double is then narrowed."""
    return np.array(_WORDS[v.lower()] if isinstance(v, str) else v, np.float64).astype(dtype)[()]


def _scalar_union(v: float | int | dict, dtype: type) -> np.generic:
    """ParseDmlScalarUnion: a number converted to the type, or {"Member": value}."""
    if isinstance(v, dict):
        ((member, inner),) = v.items()
        if member == "UInt16" and dtype == np.float16:  # float16 carried as its bits
            return np.array(inner, np.uint16).view(np.float16)[()]
        v = inner
    if dtype == np.float16:  # half(float(double)), as ParseFloat16 does
        return _float(v, np.float32).astype(np.float16)
    if np.dtype(dtype).kind == "f":
        return _float(v, dtype)
    assert isinstance(v, int)
    return np.array(v, dtype)[()]


def _packed(sizes: list[int]) -> list[int]:
    return [int(np.prod(sizes[i + 1:])) for i in range(len(sizes))]


def recompute(dispatchable: dict, input_buffer: np.ndarray | None) -> np.ndarray:
    """The spec's pseudocode over the whole output, from the JSON desc alone (flat, packed output)."""
    desc = dispatchable["desc"]
    out = desc["OutputTensor"]
    assert "Strides" not in out, "the exporter writes packed outputs"
    dtype = _NP[out["DataType"]]
    sizes = out["Sizes"]
    idx = np.indices(sizes, dtype=np.int64)
    y, x = idx[-2], idx[-1]
    if dispatchable["type"] == "DML_OPERATOR_DIAGONAL_MATRIX":
        v = _float(desc["Value"], np.float32)  # a FLOAT field
        if np.dtype(dtype).kind != "f":
            v = np.trunc(v)
        fill = np.array(v).astype(dtype)
        result = np.where(y + desc["Offset"] == x, fill, np.zeros((), dtype))
        return result.reshape(-1)
    assert dispatchable["type"] == "DML_OPERATOR_DIAGONAL_MATRIX1"
    assert desc["ValueDataType"] == out["DataType"]
    begin, end = desc["DiagonalFillBegin"], desc["DiagonalFillEnd"]
    top_x = x - y
    use_value = (end >= begin) ^ (top_x >= begin) ^ (top_x < end)
    value = _scalar_union(desc["Value"], dtype)
    if "InputTensor" in desc:
        t = desc["InputTensor"]
        assert t["DataType"] == out["DataType"] and t["Sizes"] == sizes
        strides = t.get("Strides", _packed(sizes))
        offset = sum(idx[i] * strides[i] for i in range(len(sizes)))
        other = input_buffer.reshape(-1).view(dtype)[offset]
    else:
        other = np.zeros(sizes, dtype)
    return np.where(use_value, np.full(sizes, value, dtype), other).reshape(-1)


def verify_export(folder: str) -> int:
    """Schema, resources and a recomputation of every dispatch; returns how many were recomputed."""
    with open(os.path.join(folder, "model.json")) as f:
        model = json.load(f)
    VALIDATOR.validate(model)
    res = model["resources"]
    writes = {c["resource"]: c for c in model["commands"] if c["type"] == "writeFile"}
    count = 0
    for cmd in (c for c in model["commands"] if c["type"] == "dispatch"):
        op = model["dispatchables"][cmd["dispatchable"]]
        b = cmd["bindings"]
        out_res = res[b["OutputTensor"]]
        out_desc = op["desc"]["OutputTensor"]
        n = int(np.prod(out_desc["Sizes"]))
        assert out_res == {"initialValuesDataType": out_desc["DataType"],
                           "initialValues": {"valueCount": n, "value": 0}} or out_res["sizeInBytes"] >= \
            out_desc["TotalTensorSizeInBytes"]
        buffer = None
        if "InputTensor" in b:
            in_res = res[b["InputTensor"]]
            buffer = np.load(os.path.join(folder, in_res["initialValues"]["sourcePath"]))
            assert DmlDataType.from_numpy(buffer.dtype).name == in_res["initialValuesDataType"]
            assert max(buffer.nbytes, in_res.get("sizeInBytes", 0)) >= op["desc"]["InputTensor"][
                "TotalTensorSizeInBytes"] or -(-buffer.nbytes // 4) * 4 >= op["desc"]["InputTensor"][
                "TotalTensorSizeInBytes"]
        expected = np.load(os.path.join(folder, "expected", f"{b['OutputTensor']}.npy"))
        assert writes[b["OutputTensor"]]["dimensions"] == list(expected.shape)
        assert expected.size == n and DmlDataType.from_numpy(expected.dtype).name == out_desc["DataType"]
        got = recompute(op, buffer)
        assert pipeline.bitwise_equal(got, expected.reshape(-1)), cmd["dispatchable"]
        count += 1
    return count


def simulate_dxdispatch(folder: str) -> None:
    """What `dxdispatch model.json` run inside `folder` writes: each output resource as .npy, whose
    data is the whole downloaded buffer (padded to 4 bytes), as DxDispatch's WriteNpy does."""
    with open(os.path.join(folder, "model.json")) as f:
        model = json.load(f)
    for c in model["commands"]:
        if c["type"] != "writeFile":
            continue
        arr = np.load(os.path.join(folder, "expected", f"{c['resource']}.npy"))
        buf = io.BytesIO()
        np.save(buf, arr)
        data = buf.getvalue() + b"\0" * (-arr.nbytes % 4)
        target = os.path.join(folder, c["targetPath"])
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(data)


# ---- models ----------------------------------------------------------------------------------
def _model(nodes: list, inputs: list, outputs: list, inits: tuple = (), opset: int = 17) -> onnx.ModelProto:
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=10)


def _save(model: onnx.ModelProto, tmp_path: pathlib.Path, name: str = "m.onnx") -> str:
    path = str(tmp_path / name)
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path


def one_op_models() -> list[tuple[str, onnx.ModelProto, dict]]:
    """(id, model, feeds): models whose one computation lowers to one DML node."""
    rng = np.random.default_rng(1)
    x32 = rng.standard_normal((2, 5, 7)).astype(np.float32)
    x32[0, 1, 2] = -0.0
    xi = rng.integers(-9, 9, (3, 4, 6)).astype(np.int64)
    band = np.tril(np.ones((24, 40), bool), 1) & ~np.tril(np.ones((24, 40), bool), -3)  # big enough to lower
    xw = rng.standard_normal((2, 24, 40)).astype(np.float32)
    xw[1, 0, 5] = -0.0
    cases = []
    for upper in (0, 1):
        for k in (-2, 0, 3, 2**40):
            k_init = numpy_helper.from_array(np.array(k, np.int64), "k")
            m = _model([h.make_node("Trilu", ["x", "k"], ["y"], upper=upper)],
                       [h.make_tensor_value_info("x", T.FLOAT, ["a", "b", "c"])],
                       [h.make_tensor_value_info("y", T.FLOAT, ["a", "b", "c"])], [k_init])
            cases.append((f"trilu_upper{upper}_k{k}_f32", m, {"x": x32}))
    m = _model([h.make_node("Trilu", ["x"], ["y"], upper=1)],
               [h.make_tensor_value_info("x", T.INT64, [3, 4, 6])], [h.make_tensor_value_info("y", T.INT64, [3, 4, 6])])
    cases.append(("trilu_int64", m, {"x": xi}))
    for dt, k in ((T.FLOAT, 0), (T.INT32, 2), (T.DOUBLE, -1)):
        m = _model([h.make_node("EyeLike", ["x"], ["y"], k=k, dtype=dt)],
                   [h.make_tensor_value_info("x", T.FLOAT, [4, 6])], [h.make_tensor_value_info("y", dt, [4, 6])])
        cases.append((f"eyelike_{T.DataType.Name(dt).lower()}_k{k}", m, {"x": rng.standard_normal((4, 6)).astype(np.float32)}))
    for elem, npdt, fill in ((T.FLOAT, np.float32, -np.inf), (T.FLOAT16, np.float16, -np.inf),
                             (T.FLOAT, np.float32, np.nan)):
        c = numpy_helper.from_array(np.array(fill, npdt), "c")
        mask = numpy_helper.from_array(band, "band")
        m = _model([h.make_node("Where", ["band", "x", "c"], ["y"])],
                   [h.make_tensor_value_info("x", elem, [2, 24, 40])], [h.make_tensor_value_info("y", elem, [2, 24, 40])],
                   [mask, c])
        cases.append((f"where_{np.dtype(npdt).name}_{fill}", m, {"x": xw.astype(npdt)}))
    m = _model([h.make_node("Trilu", ["x"], ["y"], upper=0)], [h.make_tensor_value_info("x", T.BOOL, [2, 5, 7])],
               [h.make_tensor_value_info("y", T.BOOL, [2, 5, 7])])
    cases.append(("trilu_bool", m, {"x": rng.random((2, 5, 7)) < 0.5}))
    return cases


ONE_OP = one_op_models()


def export(path: str, out: pathlib.Path, **kw) -> dict:
    return dxdispatch.export(path, str(out), **kw)


@pytest.mark.parametrize("case", ONE_OP, ids=lambda c: c[0])
def test_one_operator_models_equal_onnxruntime_on_the_original(case, tmp_path):
    _, model, feeds = case
    path = _save(model, tmp_path)
    report = export(path, tmp_path / "dx", feeds=feeds)
    assert len(report["operators"]) == 1, report
    assert verify_export(str(tmp_path / "dx")) == 1
    (ort_out,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    expected = np.load(tmp_path / "dx" / "expected" / f"{report['operators'][0]['output']}.npy")
    if ort_out.dtype == np.bool_:
        ort_out = ort_out.view(np.uint8)  # ONNX bool is DML UINT8
    assert pipeline.bitwise_equal(expected, ort_out)


def test_non_finite_values_are_spelled_as_the_parser_reads_them(tmp_path):
    spelled = {}
    for name, model, feeds in ONE_OP:
        if name.startswith("where_"):
            r = export(_save(model, tmp_path, f"{name}.onnx"), tmp_path / name, feeds=feeds)
            spelled[name] = r["operators"][0]["desc"]["Value"]
    assert spelled == {"where_float32_-inf": {"Float32": "-inf"}, "where_float16_-inf": {"UInt16": 0xFC00},
                       "where_float32_nan": {"Float32": "nan"}}


def test_values_round_trip_through_the_parsers_rules():
    for dt in (DmlDataType.FLOAT32, DmlDataType.FLOAT64, DmlDataType.FLOAT16):
        for v in (0.1, -0.0, 1e-40 if dt != DmlDataType.FLOAT16 else 6e-8, np.inf, -np.inf, 65504.0):
            u = ScalarUnion.of(v, dt)
            back = _scalar_union(json.loads(json.dumps(dxdispatch.scalar_union_json(u))), dt.numpy)
            assert back.tobytes() == u.numpy_value.tobytes(), (dt, v)
    for dt, v in ((DmlDataType.UINT64, 2**64 - 1), (DmlDataType.INT64, -(2**63)), (DmlDataType.INT8, -128)):
        assert dxdispatch.scalar_union_json(ScalarUnion.of(v, dt)) == v
    odd_nan = np.array(0x7FC00001, np.uint32).view(np.float32)[()]
    with pytest.raises(UnsupportedError, match="quiet NaN"):
        dxdispatch.scalar_union_json(ScalarUnion.of(odd_nan, DmlDataType.FLOAT32))
    # float16 NaNs keep their payload: the union carries the 16 bits
    h_nan = np.array(0xFE01, np.uint16).view(np.float16)[()]
    assert dxdispatch.scalar_union_json(ScalarUnion.of(h_nan, DmlDataType.FLOAT16)) == {"UInt16": 0xFE01}


def test_a_two_valued_stored_mask_binds_its_scalar_with_zero_strides(tmp_path):
    mask = np.where(np.tril(np.ones((32, 32), bool)), 1.0, -10000.0).astype(np.float32)
    m = _model([h.make_node("Add", ["x", "mask"], ["y"])], [h.make_tensor_value_info("x", T.FLOAT, [32, 32])],
               [h.make_tensor_value_info("y", T.FLOAT, [32, 32])], [numpy_helper.from_array(mask, "mask")])
    r = export(_save(m, tmp_path), tmp_path / "dx", feeds={"x": np.ones((32, 32), np.float32)})
    (op,) = r["operators"]
    assert op["desc"]["InputTensor"]["Strides"] == [0, 0]
    assert np.load(tmp_path / "dx" / "inputs" / f"{op['input']}.npy").size == 1
    assert verify_export(str(tmp_path / "dx")) == 1


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: os.path.relpath(p, os.path.join(ROOT, "models")))
def test_corpus_exports_validate_and_recompute_exactly(path, tmp_path):
    _, g = pipeline.load(path)
    dims = {d: 2 if "batch" in d.lower() else 6 for v in g.inputs for d in (v.shape or ()) if isinstance(d, str)}
    # models with saved input sets (KV caches: the mask length is past + sequence) run on a real one
    sets = sorted(glob.glob(os.path.join(ROOT, "models", "inputs", pathlib.Path(path).stem, "*.npz")))
    feeds = dict(np.load(sets[0])) if sets else None
    # (dxdispatch exports the lowering itself: counted without the optimizer's no-growth decline)
    lowered = pipeline.lower(path, Options(allow_growth=True)).after["dml_nodes"]
    if lowered == 0:
        with pytest.raises(DmlgraphError, match="nothing to export"):
            export(path, tmp_path / "dx", feeds=feeds, dims=dims)
        return
    report = export(path, tmp_path / "dx", feeds=feeds, dims=dims)
    assert len(report["operators"]) + len(report["skipped"]) == lowered
    assert verify_export(str(tmp_path / "dx")) == len(report["operators"])
    simulate_dxdispatch(str(tmp_path / "dx"))
    assert dxdispatch.check(str(tmp_path / "dx"))["ok"]


def test_feature_level_below_5_1_exports_diagonal_matrix(tmp_path):
    m = _model([h.make_node("EyeLike", ["x"], ["y"], k=1)], [h.make_tensor_value_info("x", T.FLOAT, [4, 6])],
               [h.make_tensor_value_info("y", T.FLOAT, [4, 6])])
    path = _save(m, tmp_path)
    r = export(path, tmp_path / "dx", options=Options(feature_level=FeatureLevel.L4_0),
               feeds={"x": np.zeros((4, 6), np.float32)})
    assert [o["operator"] for o in r["operators"]] == ["DML_OPERATOR_DIAGONAL_MATRIX"]
    assert verify_export(str(tmp_path / "dx")) == 1
    # a model lowered for 5_1 cannot be exported at 4_0: DIAGONAL_MATRIX1 does not exist there
    lowered = pipeline.lower(path)
    lowered_path = str(tmp_path / "lowered.onnx")
    lowered.save(lowered_path)
    with pytest.raises(UnsupportedError, match="needs feature level 5_1"):
        export(lowered_path, tmp_path / "dx2", options=Options(feature_level=FeatureLevel.L4_0),
               feeds={"x": np.zeros((4, 6), np.float32)})


def test_an_already_lowered_model_is_exported_as_it_is(tmp_path):
    _, model, feeds = ONE_OP[0]
    path = _save(model, tmp_path)
    lowered_path = str(tmp_path / "lowered.onnx")
    pipeline.lower(path).save(lowered_path)
    r = export(lowered_path, tmp_path / "dx", feeds=feeds)
    assert not r["lowered_here"] and len(r["operators"]) == 1
    assert verify_export(str(tmp_path / "dx")) == 1


def test_a_fed_initializer_that_is_a_graph_input_is_traced_with_the_fed_value(tmp_path):
    b = numpy_helper.from_array(np.ones((4, 6), np.float32), "b")
    m = _model([h.make_node("Add", ["x", "b"], ["s"]), h.make_node("Trilu", ["s"], ["y"], upper=1)],
               [h.make_tensor_value_info(n, T.FLOAT, [4, 6]) for n in ("x", "b")],
               [h.make_tensor_value_info("y", T.FLOAT, [4, 6])], [b])
    path = _save(m, tmp_path)
    feeds = {"x": np.arange(24, dtype=np.float32).reshape(4, 6), "b": np.full((4, 6), 5, np.float32)}
    report = export(path, tmp_path / "dx", feeds=feeds)
    assert report["inputs"]["b"] == ["float32", [4, 6]] and verify_export(str(tmp_path / "dx")) == 1
    expected = np.load(tmp_path / "dx" / "expected" / f"{report['operators'][0]['output']}.npy")
    assert np.array_equal(expected, np.triu(feeds["x"] + 5))  # the fed b, not the stored ones


# ---- the command line ------------------------------------------------------------------------
def _cli(*args: object) -> int:
    return cli.main([str(a) for a in args])


def test_check_passes_on_dxdispatch_output_and_fails_on_a_flipped_bit(tmp_path, capsys):
    _, model, feeds = ONE_OP[1]
    path = _save(model, tmp_path)
    np.savez(tmp_path / "in.npz", **feeds)
    out = tmp_path / "dx"
    assert _cli("dxdispatch", path, "--inputs", tmp_path / "in.npz", "-o", out) == 0
    assert _cli("dxdispatch", "--check", out) == 2  # nothing run yet
    assert "missing" in capsys.readouterr().err
    simulate_dxdispatch(str(out))
    assert _cli("dxdispatch", "--check", out, "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["matched"] == report["total"] == 1
    (written,) = glob.glob(str(out / "output" / "*.npy"))
    data = bytearray(open(written, "rb").read())
    data[-5] ^= 0x01  # one bit of one element (the last 4 bytes may be padding)
    open(written, "wb").write(bytes(data))
    assert _cli("dxdispatch", "--check", out) == 1
    text = capsys.readouterr().out
    assert "FAIL" in text and "1 of 70 elements differ" in text and "0 of 1 operators bit-exact" in text


def test_the_output_folder_is_never_overwritten_without_force(tmp_path, capsys):
    _, model, feeds = ONE_OP[0]
    path = _save(model, tmp_path)
    np.savez(tmp_path / "in.npz", **feeds)
    out = tmp_path / "dx"
    out.mkdir()  # an empty folder is fine
    assert _cli("dxdispatch", path, "--inputs", tmp_path / "in.npz", "-o", out) == 0
    before = open(out / "model.json").read()
    assert _cli("dxdispatch", path, "--dim", "a=2", "-o", out) == 2
    assert "--force" in capsys.readouterr().err
    assert open(out / "model.json").read() == before
    assert _cli("dxdispatch", path, "--dim", "a=2", "-o", out, "--force", "--json") == 0
    assert json.loads(capsys.readouterr().out)["operators"][0]["shape"][0] == 2
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".dx")]  # no temp folders left
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("x")
    assert _cli("dxdispatch", path, "-o", other, "--force") == 2
    assert "not a previous export" in capsys.readouterr().err and (other / "keep.txt").exists()


def test_an_unwritable_output_folder_is_a_clean_error(tmp_path, capsys, monkeypatch):
    """A read-only folder fails when the temp folder is made: exit 2 and one message, not exit 3."""
    _, model, feeds = ONE_OP[0]
    path = _save(model, tmp_path)

    def read_only(*a, **k):
        raise OSError(30, "Read-only file system")
    monkeypatch.setattr(dxdispatch.tempfile, "mkdtemp", read_only)
    assert _cli("dxdispatch", path, "-o", tmp_path / "dx") == 2
    err = capsys.readouterr().err
    assert "cannot write" in err and "Read-only file system" in err and "Traceback" not in err
    assert not (tmp_path / "dx").exists()


def test_usage_errors_exit_2_with_one_message(tmp_path, capsys):
    assert _cli("dxdispatch") == 2
    assert _cli("dxdispatch", "m.onnx", "--check", tmp_path) == 2
    assert _cli("dxdispatch", "--check", tmp_path) == 2
    err = capsys.readouterr().err
    assert "has no model.json" in err and "Traceback" not in err
    shutil.copy(os.path.join(ROOT, "models", "bert_dynamo.onnx"), tmp_path / "bert.onnx")
    assert _cli("dxdispatch", tmp_path / "bert.onnx", "-o", tmp_path / "dx") == 2
    assert "nothing to export" in capsys.readouterr().err
    assert not (tmp_path / "dx").exists()


def test_the_schema_accepts_dxdispatchs_own_examples_and_rejects_a_bare_infinity():
    for name in ("upstream_dml_element_wise_add_npy.json", "upstream_dml_scalar_union_fp16.json",
                 "upstream_dml_slice.json"):
        with open(os.path.join(DATA, name)) as f:
            VALIDATOR.validate(json.load(f))
    bad = {"resources": {}, "commands": [], "dispatchables": {"d": {
        "type": "DML_OPERATOR_DIAGONAL_MATRIX1",
        "desc": {"OutputTensor": {"DataType": "FLOAT32", "Sizes": [2, 2]}, "ValueDataType": "FLOAT32",
                 "Value": "-inf", "DiagonalFillBegin": 0, "DiagonalFillEnd": 1}}}}
    with pytest.raises(jsonschema.ValidationError):
        VALIDATOR.validate(bad)


def test_a_node_bound_to_a_zero_size_shape_is_not_exported(tmp_path):
    _, model, _ = ONE_OP[0]
    with pytest.raises(DmlgraphError, match="zero-size"):
        export(_save(model, tmp_path), tmp_path / "dx", feeds={"x": np.zeros((2, 0, 7), np.float32)})
    assert not (tmp_path / "dx").exists()


def test_run_traced_returns_the_runs_outputs_and_each_nodes_raw_operands(tmp_path):
    from dmlgraph.runtime.executor import Executor
    path = os.path.join(ROOT, "models", "trilu_offsets_dynamo.onnx")
    g = pipeline.lower(path).graph
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 5, 7)).astype(np.float32)}
    out, calls = Executor(g).run_traced(feeds)
    plain = Executor(g, fast=False).run(feeds)
    assert all(pipeline.bitwise_equal(out[k], plain[k]) for k in plain)
    assert len(calls) == 4
    for c in calls:
        assert c.output.shape == c.shape and (c.x is None or c.x.shape == (2, 5, 7))
