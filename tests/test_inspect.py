"""`dmlgraph inspect`: header, candidates with descs and pictures, declines, totals, JSON schema, DOT."""
from __future__ import annotations

import json
import os
import re
import shutil
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper
from onnx.backend.test.case.node import collect_testcases

import dmlgraph
from dmlgraph import inspection
from dmlgraph.errors import DmlgraphError
from dmlgraph.rewrite import Options
from dmlgraph.tools import inspection_render
from dmlgraph.tools.cli import main as cli_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "models", "synthetic", "causal_attention.onnx")
with warnings.catch_warnings():  # other ops' case generators warn about their own test data
    warnings.simplefilter("ignore")
    CASES = [c for c in collect_testcases(None) if c.name.startswith(("test_tril", "test_triu", "test_eyelike"))]

# The documented key sets (docs/inspect.md). Changing one is a schema change: bump SCHEMA.
TOP = {"schema", "model", "options", "inputs", "outputs", "ops", "initializers", "candidates", "declined", "masks", "missed",
       "totals"}
MODEL = {"path", "file_bytes", "ir_version", "opset_imports", "producer_name", "producer_version", "graph_name",
         "nodes", "external_data_files", "external_data_bytes"}
OPTIONS = {"feature_level", "target", "exact_only", "top"}
VALUE = {"name", "type", "shape"}
INITS = {"count", "bytes", "inline_count", "external_count", "external_bytes", "top"}
INIT_ROW = {"name", "shape", "type", "bytes", "storage", "location"}
CANDIDATE = {"id", "rule", "description", "scope", "nodes", "initializers", "lowers_to", "exact", "saves", "picture",
             "superseded_by", "in_lowered_graph"}
NODE = {"name", "op_type", "index"}
COVERED_INIT = {"name", "bytes", "shape", "type", "removed"}
LOWERS_TO = {"operator", "node", "begin", "begin_unbounded", "end", "end_unbounded", "value", "value_data_type",
             "onnx_type", "has_input", "input", "runtime_k", "k_input", "runtime_shape", "shape_input", "output",
             "shape_static", "desc", "desc_kind", "representative", "notes"}
DESC1 = {"operator", "begin", "end", "value", "value_data_type", "input", "output"}
BUFFER = {"data_type", "flags", "sizes", "strides", "total_bytes", "alignment"}
EXACT = {"bit_exact", "rule", "written"}
SAVES = {"nodes", "shared_nodes", "initializers", "initializer_bytes", "shared_initializer_bytes", "dml_nodes_added"}
PICTURE = {"rows", "height", "width", "of", "representative", "k", "runtime_k", "begin", "end", "legend"}
DECLINED = {"rule", "scope", "nodes", "initializers", "reason"}
MASK = {"value", "producer", "op_type", "index", "shape", "found", "status", "rule", "reason", "scope"}
TOTALS = {"target", "feature_level", "grows", "optimize_writes_lowered", "declined_for_growth", "portable",
          "candidates", "declined", "rewrites", "nodes_removed", "nodes_added",
          "dml_nodes_added", "nested_dml_nodes", "initializers_removed", "initializer_bytes_removed", "initializers_added",
          "initializer_bytes_added", "before", "after"}
STATS = {"nodes", "ops", "initializers", "initializer_bytes", "constant_bytes", "file_bytes"}


def _save(model: onnx.ModelProto, path) -> str:
    onnx.save(model, str(path))
    return str(path)


def _is_zero_size(case) -> bool:
    return any(d.HasField("dim_value") and d.dim_value == 0
               for i in case.model.graph.input for d in i.type.tensor_type.shape.dim)


def _constant_k(case) -> onnx.ModelProto:
    """The case with its run-time k input turned into an initializer holding the test data's k."""
    m = onnx.ModelProto()
    m.CopyFrom(case.model)
    names = [i.name for i in m.graph.input]
    if "k" in names:
        k = np.asarray(case.data_sets[0][0][names.index("k")], np.int64)
        keep = [i for i in m.graph.input if i.name != "k"]
        del m.graph.input[:]
        m.graph.input.extend(keep)
        m.graph.initializer.append(numpy_helper.from_array(k, "k"))
    return m


def check_keys(r: dict) -> None:
    assert set(r) == TOP
    assert r["schema"] == inspection.SCHEMA
    assert set(r["model"]) == MODEL and set(r["options"]) == OPTIONS and set(r["initializers"]) == INITS
    assert all(set(v) == VALUE for v in r["inputs"] + r["outputs"])
    assert all(set(t) == INIT_ROW for t in r["initializers"]["top"])
    for c in r["candidates"]:
        assert set(c) == CANDIDATE
        assert all(set(n) == NODE for n in c["nodes"])
        assert all(set(i) == COVERED_INIT for i in c["initializers"])
        assert set(c["lowers_to"]) == LOWERS_TO and set(c["exact"]) == EXACT and set(c["saves"]) == SAVES
        assert set(c["picture"]) == PICTURE
        desc = c["lowers_to"]["desc"]
        if desc is not None and desc["operator"] == "DIAGONAL_MATRIX1":
            assert set(desc) == DESC1 and set(desc["output"]) == BUFFER
            assert desc["input"] is None or set(desc["input"]) == BUFFER
    assert all(set(m) == MASK for m in r["masks"])
    assert r["missed"] == [m for m in r["masks"] if m["status"] == "missed"]
    for d in r["declined"]:
        assert set(d) == DECLINED
        assert all(set(n) == NODE for n in d["nodes"])
    assert set(r["totals"]) == TOTALS
    assert set(r["totals"]["before"]) == STATS and set(r["totals"]["after"]) == STATS
    json.dumps(r, allow_nan=False)  # strict JSON: no NaN/Infinity, no numpy types


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """Every conformance case inspected twice: as shipped (k at run time) and with k made constant."""
    d = tmp_path_factory.mktemp("conformance")
    out = {}
    for case in CASES:
        out[case.name] = (inspection.inspect_model(_save(case.model, d / f"{case.name}.onnx"), Options()),
                          inspection.inspect_model(_save(_constant_k(case), d / f"{case.name}_constk.onnx"),
                                                   Options()))
    return out


def test_the_text_totals_say_they_are_allow_growths_when_sites_are_declined(capsys):
    """eye_static8_dynamo's two stored masks are declined for growth: optimize writes them as
    they were, while the totals and the table lower them, as --allow-growth does."""
    path = os.path.join(ROOT, "models", "eye_static8_dynamo.onnx")
    assert cli_main(["inspect", path]) == 0
    text = capsys.readouterr().out
    assert "totals (target dml): optimize --allow-growth would remove" in text
    assert cli_main(["inspect", DEMO]) == 0
    assert "totals (target dml): optimize would remove" in capsys.readouterr().out


@pytest.mark.parametrize("target", ["dml", "onnx"])
def test_the_node_totals_add_up_to_the_written_model(target):
    """before - removed + added = after. The clean-up folds a TorchScript export's Constants too:
    counting only the rewrites' removals gave llama_kv_ts `nodes_added` -208 ("add 1 generator
    written as -208 standard ONNX nodes")."""
    t = dmlgraph.inspect(os.path.join(ROOT, "models", "llama_kv_ts.onnx"), target=target).totals
    assert t["nodes_added"] >= t["dml_nodes_added"] >= 1 and t["nodes_removed"] >= 0
    assert t["before"]["nodes"] - t["nodes_removed"] + t["nodes_added"] == t["after"]["nodes"]


def test_conformance_cases_are_all_there():
    assert len(CASES) == 21
    assert sum(_is_zero_size(c) for c in CASES) == 2


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_conformance_case_candidates(case, reports):
    r, rk = reports[case.name]
    check_keys(r)
    check_keys(rk)
    op = case.model.graph.node[0].op_type
    rule = {"Trilu": "trilu", "EyeLike": "eyelike"}[op]
    if _is_zero_size(case):
        assert r["candidates"] == []
        assert len(r["declined"]) == 1
        d = r["declined"][0]
        assert d["rule"] == rule and [n["op_type"] for n in d["nodes"]] == [op]
        assert "zero-size" in d["reason"]
        assert r["totals"]["nodes_removed"] == 0 and r["totals"]["dml_nodes_added"] == 0
        return
    assert r["declined"] == [] and len(r["candidates"]) == 1
    c = r["candidates"][0]
    assert c["rule"] == rule and c["nodes"] == [{"name": case.model.graph.node[0].name, "op_type": op, "index": 0}]
    t = c["lowers_to"]
    assert t["operator"] == "DIAGONAL_MATRIX1"
    assert t["has_input"] == (op == "Trilu")
    assert t["runtime_k"] == ("k" in [i.name for i in case.model.graph.input])
    assert c["exact"] == {"bit_exact": True, "rule": "bit-exact", "written": True}
    assert c["saves"]["nodes"] == 1 and c["saves"]["dml_nodes_added"] == 1
    # Static shapes: the exact desc, from binding.node_desc.
    shape = list(case.data_sets[0][1][0].shape)
    assert t["shape_static"] and t["desc_kind"] == "exact" and t["representative"] is None
    out = t["desc"]["output"]
    assert np.prod(out["sizes"]) == np.prod(shape) and out["sizes"][-2:] == shape[-2:]
    itemsize = case.data_sets[0][1][0].dtype.itemsize
    assert out["total_bytes"] == -(-np.prod(shape) * itemsize // 4) * 4
    assert t["desc"]["value_data_type"] == t["value_data_type"] == out["data_type"]
    assert (t["desc"]["input"] is not None) == (op == "Trilu")
    assert r["totals"]["nodes_removed"] == 1 and r["totals"]["dml_nodes_added"] == 1


@pytest.mark.parametrize("case", [c for c in CASES if not _is_zero_size(c)],
                         ids=[c.name for c in CASES if not _is_zero_size(c)])
def test_conformance_picture_matches_reference_output(case, reports):
    """With k constant, the picture is the top-left corner of the expected output's first slice."""
    _, r = reports[case.name]
    (c,) = r["candidates"]
    p = c["picture"]
    assert not p["runtime_k"] and not p["representative"]
    x = np.asarray(case.data_sets[0][0][0])
    y = np.asarray(case.data_sets[0][1][0])
    ys = y.reshape((-1,) + y.shape[-2:])[0]
    xs = x.reshape((-1,) + x.shape[-2:])[0]
    assert (p["height"], p["width"]) == (min(8, ys.shape[0]), min(8, ys.shape[1]))
    for i, row in enumerate(p["rows"]):
        for j, cell in enumerate(row):
            assert ys[i, j] == (xs[i, j] if cell == "x" else float(cell)), (i, j, cell)


def test_text_shows_picture_and_desc(tmp_path, capsys):
    case = next(c for c in CASES if c.name == "test_tril")
    path = _save(case.model, tmp_path / "tril.onnx")
    assert cli_main(["inspect", path]) == 0
    text = capsys.readouterr().out
    assert "[1] trilu: Trilu #0" in text
    assert "lowers to DIAGONAL_MATRIX1: Begin 1, End INT32_MAX (unbounded), Value 0 (INT64), input 'x'" in text
    assert "DiagonalFillBegin 1, DiagonalFillEnd INT32_MAX, Value 0, ValueDataType INT64" in text
    assert "OutputTensor: INT64 sizes [4, 5] strides packed TotalTensorSizeInBytes 160" in text
    assert "InputTensor : INT64 sizes [4, 5] strides [5, 1] TotalTensorSizeInBytes 160" in text
    picture = ["[[x, 0, 0, 0, 0],", " [x, x, 0, 0, 0],", " [x, x, x, 0, 0],", " [x, x, x, x, 0]]"]
    lines = [ln.strip() for ln in text.splitlines()]
    start = lines.index(picture[0].strip())
    assert lines[start:start + 4] == [p.strip() for p in picture]
    assert "totals (target dml): optimize would remove 1 node and 0 initializers (0 B), add 1 DML node" in text


def test_eyelike_picture_like_the_spec(tmp_path):
    """EyeLike k=1 on 4x5 (the spec's 3-wide-strip page uses the same drawing)."""
    x = h.make_tensor_value_info("x", T.FLOAT, [4, 5])
    g = h.make_graph([h.make_node("EyeLike", ["x"], ["y"], k=1)], "g", [x],
                     [h.make_tensor_value_info("y", T.FLOAT, [4, 5])])
    path = _save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10), tmp_path / "e.onnx")
    r = inspection.inspect_model(path)
    p = r["candidates"][0]["picture"]
    assert inspection.picture_text(p) == ["[[0, 1, 0, 0, 0],", " [0, 0, 1, 0, 0],", " [0, 0, 0, 1, 0],",
                                          " [0, 0, 0, 0, 1]]"]
    d = r["candidates"][0]["lowers_to"]["desc"]
    assert d["input"] is None and (d["begin"], d["end"]) == (1, 2)
    assert d["output"] == {"data_type": "FLOAT32", "flags": 0, "sizes": [4, 5], "strides": None,
                           "total_bytes": 80, "alignment": 0}


def _covering(r, op_type):
    return [c for c in r["candidates"] if op_type in [n["op_type"] for n in c["nodes"]]]


def test_causal_attention_model():
    """The Trilu-built causal mask and the EyeLike both lower, whichever rules take them.

    With the full rule set the mask subgraph (Shape..Trilu..Equal) becomes one generator that the
    Where then absorbs (mask_where); the EyeLike subgraph becomes another generator.
    """
    r = inspection.inspect_model(DEMO, Options())
    check_keys(r)
    assert r["declined"] == []
    assert r["model"]["ir_version"] == 10 and r["model"]["opset_imports"] == {"ai.onnx": 18}
    assert r["model"]["producer_name"] == "dmlgraph-synthetic" and r["model"]["nodes"] == 14
    assert r["inputs"][0] == {"name": "q", "type": "FLOAT", "shape": ["batch", 2, "seq", 8]}
    assert r["outputs"][1]["shape"] == ["batch", 2, "seq", "seq"]
    assert r["ops"]["Trilu"] == 1 and r["ops"]["EyeLike"] == 1 and sum(r["ops"].values()) == 14
    assert r["initializers"]["count"] == 4 and r["initializers"]["bytes"] == 20
    assert r["initializers"]["top"][0] == {"name": "idx2", "shape": [1], "type": "INT64", "bytes": 8,
                                           "storage": "inline", "location": None}
    assert len(r["candidates"]) >= 2
    for c in r["candidates"]:
        assert c["lowers_to"]["operator"] == "DIAGONAL_MATRIX1" and c["exact"]["bit_exact"] is True
        assert c["in_lowered_graph"] or c["superseded_by"] is not None

    (tri,) = _covering(r, "Trilu")
    t = tri["lowers_to"]
    # upper=0, k=0: the fill (the masked part) is x - y >= 1, open to the right.
    assert (t["begin"], t["begin_unbounded"], t["end"], t["end_unbounded"]) == (1, False, 2**31 - 1, True)
    assert not t["runtime_k"]
    # Symbolic output: desc sizes by name, plus a labelled representative desc.
    assert not t["shape_static"] and t["desc_kind"] == "symbolic"
    assert t["desc"]["output"]["sizes"][-2:] == ["seq", "seq"]
    assert t["representative"]["dims"]["seq"] == 8 and t["representative"]["desc"]["output"]["sizes"][-2:] == [8, 8]
    assert "bound at run time" in " ".join(t["notes"])
    rows = tri["picture"]["rows"]
    assert tri["picture"]["representative"] and len(rows) == 8
    assert all(rows[i][j] != rows[0][0] for i in range(8) for j in range(8) if j > i)  # the fill is above

    (eye,) = _covering(r, "EyeLike")
    e = eye["lowers_to"]
    assert e["runtime_shape"] and not e["has_input"] and (e["begin"], e["end"]) == (0, 1) and e["value"] == 1.0
    assert e["desc"]["output"] == {"data_type": "FLOAT32", "flags": 0, "sizes": ["seq", "seq"], "strides": None,
                                   "total_bytes": "4*seq*seq", "alignment": 0}
    assert eye["picture"]["rows"][:3] == [["1", "0", "0", "0", "0", "0", "0", "0"],
                                         ["0", "1", "0", "0", "0", "0", "0", "0"],
                                         ["0", "0", "1", "0", "0", "0", "0", "0"]]
    tot = r["totals"]
    kept = sum(c["in_lowered_graph"] for c in r["candidates"])
    assert tot["dml_nodes_added"] == kept == tot["after"]["ops"]["DiagonalMatrix1"] == 2
    assert not {"Trilu", "EyeLike"} & set(tot["after"]["ops"])
    assert tot["before"]["nodes"] == 14 and tot["nodes_removed"] >= 2
    assert tot["after"]["nodes"] == 14 - tot["nodes_removed"] + tot["nodes_added"]
    assert tot["after"]["initializer_bytes"] == (20 - tot["initializer_bytes_removed"]
                                                 + tot["initializer_bytes_added"])
    assert sum(c["saves"]["nodes"] for c in r["candidates"]) <= tot["nodes_removed"]
    # The portable target writes each generator as standard ops: more nodes, no DML ops.
    ro = inspection.inspect_model(DEMO, Options(), target="onnx")
    assert ro["totals"]["dml_nodes_added"] == 2 and "DiagonalMatrix1" not in ro["totals"]["after"]["ops"]
    assert ro["totals"]["nodes_added"] > tot["nodes_added"]


def test_a_long_candidate_is_summed_up_by_op_and_listed_whole_with_verbose(capsys):
    """A mask cone of 41 nodes is one line (its count per op and its last node), not a wall of
    names; `-v` lists each, in the order the JSON report has them."""
    model = os.path.join(ROOT, "models", "mistral_sw4_kv_ts.onnx")
    assert cli_main(["inspect", model]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[1] ")]
    assert line == ("[1] mask_subgraph: 41 nodes up to And '/model/model/And_2' #63 (14 Constant, 6 Cast, "
                    "6 Unsqueeze, 3 And, 2 Shape, 2 Gather, 2 Range, 2 Add, 1 ConstantOfShape, 1 Sub, 1 Greater, "
                    "1 LessOrEqual)")
    assert cli_main(["inspect", "-v", model]) == 0
    (whole,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[1] ")]
    assert cli_main(["inspect", "--json", model]) == 0
    nodes = json.loads(capsys.readouterr().out)["candidates"][0]["nodes"]
    assert len(nodes) == 41 and whole.count(", ") == 40
    assert whole.startswith("[1] mask_subgraph: Shape '/model/model/Shape' #6, Constant '/model/model/Constant' #7")


def test_causal_attention_text(capsys):
    assert cli_main(["inspect", DEMO]) == 0
    text = capsys.readouterr().out
    assert "model     " in text and "format    IR 10, opsets ai.onnx 18, producer dmlgraph-synthetic" in text
    assert "q     FLOAT  [batch, 2, seq, 8]" in text
    assert "Trilu 'causal_tril' #7" in text and "EyeLike 'identity' #12" in text
    assert ": sizes bound at run time" in text and "representative desc at" in text
    assert "sizes [seq, seq] strides packed TotalTensorSizeInBytes 4*seq*seq" in text
    assert " [0, 1, 0, 0, 0, 0, 0, 0, ...]," in text  # the identity's second row
    assert "totals (target dml): optimize would remove" in text and "add 2 DML nodes" in text
    assert "DiagonalMatrix1             0             2" in text  # the before/after table


def test_cli_json(capsys):
    assert cli_main(["inspect", DEMO, "--json"]) == 0
    captured = capsys.readouterr()
    r = json.loads(captured.out)
    check_keys(r)
    assert len(r["candidates"]) >= 2 and r["options"]["target"] == "dml"
    assert captured.err == ""  # no progress when --json


def test_cli_feature_level_4_0_lowers_to_diagonal_matrix(tmp_path, capsys):
    case = next(c for c in CASES if c.name == "test_eyelike_without_dtype")
    path = _save(case.model, tmp_path / "eye.onnx")
    assert cli_main(["inspect", path, "--json", "--feature-level", "4_0"]) == 0
    r = json.loads(capsys.readouterr().out)
    (c,) = r["candidates"]
    assert c["lowers_to"]["operator"] == "DIAGONAL_MATRIX"
    assert c["lowers_to"]["desc"] == {"operator": "DIAGONAL_MATRIX", "offset": 0, "value": 1.0,
                                      "output": {"data_type": "INT32", "flags": 0, "sizes": [4, 4],
                                                 "strides": None, "total_bytes": 64, "alignment": 0}}
    assert r["options"]["feature_level"] == "4_0"
    assert cli_main(["inspect", path, "--feature-level", "9_9"]) == 2
    assert "unknown feature level" in capsys.readouterr().err


def test_bfloat16_trilu_is_declined(tmp_path):
    x = h.make_tensor_value_info("x", T.BFLOAT16, [4, 4])
    g = h.make_graph([h.make_node("Trilu", ["x"], ["y"], name="bf")], "g", [x],
                     [h.make_tensor_value_info("y", T.BFLOAT16, [4, 4])])
    path = _save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10), tmp_path / "bf.onnx")
    r = inspection.inspect_model(path)
    check_keys(r)
    assert r["candidates"] == []
    (d,) = r["declined"]
    assert d["rule"] == "trilu" and d["nodes"] == [{"name": "bf", "op_type": "Trilu", "index": 0}]
    assert "BFLOAT16" in d["reason"] and "DirectML" in d["reason"]
    assert "declined:" in inspection_render.format_text(r) and "BFLOAT16" in inspection_render.format_text(r)


def _dot_structure(text: str) -> tuple[set, list]:
    """A structural check of DOT: balanced braces outside strings, declared nodes, edge endpoints."""
    assert text.startswith("digraph ")
    stripped = re.sub(r'"(?:[^"\\]|\\.)*"', lambda m: "Q" * len(m.group(0)), text)  # mask strings
    depth = 0
    for ch in stripped:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        assert depth >= 0
    assert depth == 0
    ident = r'"(?:[^"\\]|\\.)*"'
    declared = set(re.findall(rf"^\s*({ident})\s*\[", text, re.M))
    edges = re.findall(rf"^\s*({ident})\s*->\s*({ident})", text, re.M)
    for a, b in edges:
        assert a in declared and b in declared, (a, b)
    return declared, edges


def test_dot_output(tmp_path, capsys):
    dot = tmp_path / "g.dot"
    assert cli_main(["inspect", DEMO, "--dot", str(dot)]) == 0
    assert f"wrote {dot}" in capsys.readouterr().out
    text = dot.read_text()
    declared, edges = _dot_structure(text)
    ops = {f'"n{i}"' for i in range(14)}
    assert ops | {'"in:q"', '"in:k"', '"in:v"', '"out:attn"', '"out:scores_plus_eye"'} <= declared
    assert len(edges) >= 21
    r = inspection.inspect_model(DEMO)
    for c in r["candidates"]:
        assert f'subgraph "cluster_c{c["id"]}"' in text
        assert f'label="[{c["id"]}] {c["rule"]} -> DIAGONAL_MATRIX1"' in text
    assert re.search(r'"n7" \[label="Trilu\\ncausal_tril", style="rounded,filled"', text)
    assert re.search(r'"n12" \[label="EyeLike\\nidentity", style="rounded,filled"', text)
    assert re.search(r'"n0" \[label="Transpose"\]', text)  # not a candidate: plain


def test_dot_marks_declined_and_covered_constants(tmp_path):
    x = h.make_tensor_value_info("x", T.BFLOAT16, [4, 4])
    g = h.make_graph([h.make_node("Trilu", ["x"], ["y"], name="bf")], "g", [x],
                     [h.make_tensor_value_info("y", T.BFLOAT16, [4, 4])])
    path = _save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10), tmp_path / "bf.onnx")
    text = inspection_render.to_dot(inspection.analyze(path))
    _dot_structure(text)
    assert re.search(r'"n0" \[label="Trilu\\nbf", style="rounded,dashed", color="#cc0000", '
                     r'tooltip="declined: [^"]*BFLOAT16', text)


def test_svg_without_graphviz_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(inspection_render.shutil, "which", lambda name: None)
    svg = tmp_path / "g.svg"
    assert cli_main(["inspect", DEMO, "--svg", str(svg), "--dot", str(tmp_path / "g.dot")]) == 2
    err = capsys.readouterr().err
    assert "Graphviz is not installed" in err and "--dot FILE" in err
    assert not svg.exists()
    with pytest.raises(DmlgraphError, match="Graphviz is not installed"):
        inspection_render.render_svg(str(tmp_path / "g.dot"), str(svg))


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz `dot` is not installed")
def test_svg_with_graphviz(tmp_path, capsys):
    svg = tmp_path / "g.svg"
    assert cli_main(["inspect", DEMO, "--svg", str(svg)]) == 0
    content = svg.read_text()
    assert "<svg" in content and "causal_tril" in content


def _external_model(tmp_path, rows=1024, cols=2048):
    """A MatMul with 8 MiB of external weights, plus a Trilu and an EyeLike to lower."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    nodes = [h.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
             h.make_node("Trilu", ["m"], ["tri"], name="tri", upper=1),
             h.make_node("EyeLike", ["m"], ["eye"], name="eye")]
    g = h.make_graph(nodes, "ext", [h.make_tensor_value_info("x", T.FLOAT, [1, rows]),
                                    h.make_tensor_value_info("m", T.FLOAT, ["n", "n"])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, cols]),
                      h.make_tensor_value_info("tri", T.FLOAT, ["n", "n"]),
                      h.make_tensor_value_info("eye", T.FLOAT, ["n", "n"])],
                     [numpy_helper.from_array(w, "w"),
                      numpy_helper.from_array(np.arange(4, dtype=np.int64), "small")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    path = tmp_path / "ext.onnx"
    onnx.save(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="ext.data",
              size_threshold=0)
    return str(path), w.nbytes


def _rchar() -> int | None:
    try:
        with open("/proc/self/io") as f:
            return int(next(ln for ln in f if ln.startswith("rchar:")).split()[1])
    except (OSError, StopIteration):
        return None


def test_external_data_is_not_read(tmp_path, monkeypatch):
    path, nbytes = _external_model(tmp_path)
    assert os.path.getsize(path) < 4096 and os.path.getsize(tmp_path / "ext.data") >= nbytes

    def refuse(*a, **k):
        raise AssertionError("external data was read")
    real_to_array = onnx.numpy_helper.to_array

    def to_array(t, *a, **k):
        if t.name == "w" or (t.HasField("data_location") and t.data_location == T.EXTERNAL):
            raise AssertionError(f"numpy_helper.to_array read external tensor {t.name!r}")
        return real_to_array(t, *a, **k)
    monkeypatch.setattr(np, "fromfile", refuse)
    monkeypatch.setattr(onnx.numpy_helper, "to_array", to_array)
    monkeypatch.setattr(onnx, "load_external_data_for_model", refuse)
    before = _rchar()
    r = inspection.inspect_model(path, Options(), top=5)
    read = None if before is None else _rchar() - before
    check_keys(r)
    if read is not None:
        assert read < nbytes // 4, f"{read} bytes read for an {nbytes}-byte external tensor"
    inits = r["initializers"]
    assert inits["count"] == 2 and inits["external_count"] == 2
    assert inits["bytes"] == nbytes + 32 and inits["external_bytes"] == nbytes + 32
    assert inits["top"][0] == {"name": "w", "shape": [1024, 2048], "type": "FLOAT", "bytes": nbytes,
                               "storage": "external", "location": "ext.data"}
    assert r["model"]["external_data_files"] == ["ext.data"]
    assert r["model"]["external_data_bytes"] == nbytes + 32
    assert sorted(c["rule"] for c in r["candidates"]) == ["eyelike", "trilu"]
    assert r["totals"]["initializer_bytes_removed"] == 32  # "small" is unused: dead-code removal drops it
    text = inspection_render.format_text(r)
    assert "external (ext.data)" in text and "8.0 MiB" in text


def test_top_and_bad_paths(tmp_path, capsys):
    r = inspection.inspect_model(DEMO, top=1)
    assert len(r["initializers"]["top"]) == 1 and r["options"]["top"] == 1
    assert cli_main(["inspect", str(tmp_path / "missing.onnx")]) == 2
    assert "not found" in capsys.readouterr().err
    with pytest.raises(DmlgraphError):
        inspection.inspect_model(DEMO, top=-1)
    bad = tmp_path / "nodir" / "g.dot"
    assert cli_main(["inspect", DEMO, "--dot", str(bad)]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_symbolic_rank5_and_runtime_k(tmp_path):
    """Rank 5 with symbolic dims: no symbolic sizes (folded at bind time), a representative desc of rank 4."""
    x = h.make_tensor_value_info("x", T.FLOAT16, ["a", 2, 3, "n", "n"])
    k = h.make_tensor_value_info("k", T.INT64, [])
    g = h.make_graph([h.make_node("Trilu", ["x", "k"], ["y"], name="t5")], "g", [x, k],
                     [h.make_tensor_value_info("y", T.FLOAT16, ["a", 2, 3, "n", "n"])])
    path = _save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10), tmp_path / "t5.onnx")
    r = inspection.inspect_model(path)
    check_keys(r)
    (c,) = r["candidates"]
    t = c["lowers_to"]
    assert t["runtime_k"] and t["k_input"] == "k" and t["value_data_type"] == "FLOAT16"
    assert t["desc"]["output"]["sizes"] is None and t["desc"]["output"]["total_bytes"] == "12*a*n*n"
    rep = t["representative"]
    assert rep["dims"] == {"a": 8, "n": 8} and len(rep["desc"]["output"]["sizes"]) <= 4
    assert c["picture"]["runtime_k"] and c["picture"]["k"] == 0
    text = inspection_render.format_text(r)
    assert "run-time k 'k'" in text and "k = 0 shown" in text and "folded at bind time" in text


def test_symbolic_sizes_named_by_expressions_are_multiplied_whole(tmp_path):
    """Exporters name a dim `past + seq`: the desc's byte count multiplies it whole, in parentheses
    (it read `seq*past + seq`, a different number)."""
    x = h.make_tensor_value_info("x", T.FLOAT, ["seq", "past + seq"])
    g = h.make_graph([h.make_node("Trilu", ["x"], ["y"], name="t")], "g", [x],
                     [h.make_tensor_value_info("y", T.FLOAT, ["seq", "past + seq"])])
    path = _save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10), tmp_path / "t.onnx")
    (c,) = inspection.inspect_model(path)["candidates"]
    out = c["lowers_to"]["desc"]["output"]
    assert out["sizes"][-2:] == ["seq", "past + seq"]
    assert out["total_bytes"] == "4*seq*(past + seq)"


def test_stored_mask_constant(tmp_path):
    """A stored causal mask (0 / -inf) added to scores: the constant's bytes are what lowering saves."""
    n = 64
    mask = np.triu(np.full((n, n), -np.inf, np.float32), 1)
    g = h.make_graph([h.make_node("Add", ["x", "mask"], ["y"], name="add_mask")], "sm",
                     [h.make_tensor_value_info("x", T.FLOAT, [2, n, n])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2, n, n])], [numpy_helper.from_array(mask, "mask")])
    path = _save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10), tmp_path / "sm.onnx")
    ins = inspection.analyze(path)
    r = ins.report
    check_keys(r)
    assert r["candidates"], r["declined"]
    owners = [c for c in r["candidates"] if any(i["name"] == "mask" and i["removed"] for i in c["initializers"])]
    assert len(owners) == 1  # counted once, never twice
    assert sum(c["saves"]["initializer_bytes"] for c in r["candidates"]) == mask.nbytes
    assert r["totals"]["initializer_bytes_removed"] == mask.nbytes and r["totals"]["after"]["initializer_bytes"] == 0
    assert any(c["picture"]["rows"][0][:2] in (["0", "-inf"], ["x", "-inf"]) for c in r["candidates"])
    assert all(c["lowers_to"]["value"] == "-inf" for c in r["candidates"])  # strict JSON for -inf
    declared, _ = _dot_structure(inspection_render.to_dot(ins))
    assert '"init:mask"' in declared
    # Exact-only: every rewrite that remains is bit-exact.
    re_ = inspection.inspect_model(path, Options(exact_only=True))
    assert all(c["exact"]["bit_exact"] for c in re_["candidates"])
    assert re_["options"]["exact_only"] is True


def test_inspect_says_when_the_targets_form_is_not_bit_exact():
    """band_w2's window fill on `onnx` is `Where(window, X, fill)` (a -0.0 of X comes out +0.0):
    inspect says so per candidate, as optimize does, and not under --exact nor on `dml`."""
    path = os.path.join(ROOT, "models", "band_w2_ts.onnx")
    loose = dmlgraph.inspect(path, target="onnx").candidates
    opt = dmlgraph.optimize(path, target="onnx")
    assert sorted(c["exact"]["written"] for c in loose) == sorted(r.exact for r in opt.rewrites) == [False, True]
    assert all(c["exact"]["written"] for c in dmlgraph.inspect(path, target="onnx", exact=True).candidates)
    assert all(c["exact"]["written"] for c in dmlgraph.inspect(path, target="dml").candidates)
