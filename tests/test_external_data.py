"""Models whose weights are external data, in the layouts exporters write, through `optimize`.

Issue 26: the dynamo exporter's `model.onnx` + `model.onnx.data` made `optimize` exit 3 ("fails onnx's
checker: ... should be stored in model.onnx.data, but it is not regular file") unless run from the
model's folder: the output check handed onnx's checker a proto that still named the input's data
files, and the checker looks for them relative to the working directory. Issue 28 (class 4): data
reached through a symlink inside the model's folder, or a data file with several hard links, is
accepted by `run` and `inspect` (onnxruntime loads such models) and made `optimize` exit 3 the same
way. The policy: accept them at load, and write outputs that pass onnx's checker (the output's data
is always a new regular file with one link).

Every layout here (one data file for all tensors, one file per tensor, a `location` in subfolders,
a symlink, a hard link), to both targets, into another folder and the model's own, from a working
directory where the input's locations do not resolve: exit 0, the input untouched, the output passes
onnx's checker from its path and computes what the input does. Models over 2 GiB take the same
code path as a small model written over a lowered external-data threshold; the real 2.1 GiB run is
opt-in (`DMLGRAPH_BIG_TESTS=1`, about a minute).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper
from test_hostile import ort_run, run_target
from test_reliability import assert_clean_error, assert_ok, run_cli, tree_digest

import dmlgraph
from dmlgraph.io import saving

LAYOUTS = ("one_file", "per_tensor", "subfolder", "symlink", "hardlink")
MASK = 16


def decoder(d: int = 8, layers: int = 3, weights: list[T] | None = None) -> onnx.ModelProto:
    """x @ layers.0.weight @ ... (torch's initializer names), a stored causal mask added to scores
    and a Trilu: something to lower besides the weights."""
    rng = np.random.default_rng(0)
    if weights is None:
        weights = [numpy_helper.from_array(rng.standard_normal((d, d)).astype(np.float32), f"layers.{i}.weight")
                   for i in range(layers)]
    causal = np.where(np.arange(MASK)[None, :] > np.arange(MASK)[:, None], np.float32(-np.inf), np.float32(0))
    nodes = [h.make_node("MatMul", ["x", weights[0].name], ["h0"])]
    nodes += [h.make_node("MatMul", [f"h{i - 1}", w.name], [f"h{i}"]) for i, w in enumerate(weights) if i]
    nodes += [h.make_node("Add", ["scores", "causal_mask"], ["masked"]),
              h.make_node("Trilu", ["scores"], ["tril"], upper=0)]
    last = f"h{len(weights) - 1}"
    graph = h.make_graph(nodes, "decoder", [h.make_tensor_value_info("x", T.FLOAT, ["n", d]),
                                            h.make_tensor_value_info("scores", T.FLOAT, ["b", MASK, MASK])],
                         [h.make_tensor_value_info(last, T.FLOAT, ["n", d]),
                          h.make_tensor_value_info("masked", T.FLOAT, ["b", MASK, MASK]),
                          h.make_tensor_value_info("tril", T.FLOAT, ["b", MASK, MASK])],
                         [*weights, numpy_helper.from_array(causal, "causal_mask")])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


def export(folder, layout: str) -> str:
    """The model saved as exporters save it (onnx.save, that is onnx.external_data_helper): one data
    file `model.onnx.data` (torch's dynamo exporter), a file per tensor named after it, one file in
    subfolders; or one file reached through a symlink, or with a second hard link."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "model.onnx")
    kwargs = {"save_as_external_data": True, "size_threshold": 0, "all_tensors_to_one_file": True,
              "location": {"subfolder": "weights/sub/w.bin", "symlink": "link.data"}.get(layout, "model.onnx.data")}
    if layout == "per_tensor":
        kwargs["all_tensors_to_one_file"] = False
    if layout == "subfolder":
        os.makedirs(os.path.join(folder, "weights", "sub"))
    onnx.save(decoder(), path, **kwargs)
    if layout == "symlink":
        os.rename(os.path.join(folder, "link.data"), os.path.join(folder, "store.bin"))
        os.symlink("store.bin", os.path.join(folder, "link.data"))
    if layout == "hardlink":
        os.link(os.path.join(folder, "model.onnx.data"), os.path.join(folder, "backup.data"))
    return path


def feeds(d: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"x": rng.standard_normal((3, d)).astype(np.float32),
            "scores": rng.standard_normal((2, MASK, MASK)).astype(np.float32)}


def assert_written_well(out: str, target: str, source: str) -> None:
    """Passes onnx's checker (full check) from its path; computes what the source computes."""
    onnx.checker.check_model(out, full_check=True)
    want = ort_run(source, feeds())
    for a, b in zip(want, run_target(target, out, feeds()), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("where", ["other_folder", "same_folder"])
@pytest.mark.parametrize("target", ["dml", "onnx"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_optimize_writes_every_layout(layout, target, where, tmp_path, capsys, monkeypatch):
    """Was exit 3 in every case (from a folder where the input's locations do not resolve for the
    first three layouts; from the model's folder for the symlink and the hard link)."""
    src = export(tmp_path / "in", layout)
    cwd = tmp_path / "in" if layout in ("symlink", "hardlink") else tmp_path / "elsewhere"
    os.makedirs(cwd, exist_ok=True)
    monkeypatch.chdir(cwd)
    out_dir = tmp_path / ("in" if where == "same_folder" else "out")
    os.makedirs(out_dir, exist_ok=True)
    out = str(out_dir / "lowered.onnx")
    before = tree_digest(tmp_path / "in")
    assert_ok(*run_cli(["optimize", src, "-o", out, "--target", target], capsys))
    assert {p: d for p, d in tree_digest(tmp_path / "in").items() if "lowered" not in p} == before
    assert not os.path.exists(out + ".data")  # small: one self-contained file
    assert_written_well(out, target, src)
    for command in (["run", src], ["inspect", src]):  # (accepted before, still)
        assert_ok(*run_cli(command, capsys))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_model_over_the_threshold_is_written_with_its_own_data_file(layout, tmp_path, monkeypatch):
    """A model over 1.8 GB is written as `out.onnx` + `out.onnx.data` (protobuf cannot hold 2 GiB):
    the same path as a small model with the threshold lowered. The data file is new, regular and
    has one link whatever the input's was; the public API's save and check take it too."""
    src = export(tmp_path / "in", layout)
    monkeypatch.setattr(saving, "_EXTERNAL_THRESHOLD", 1000)
    monkeypatch.chdir(tmp_path)
    before = tree_digest(tmp_path / "in")
    for target in ("dml", "onnx"):
        result = dmlgraph.optimize(src, target=target)
        result.check()
        out = str(tmp_path / "in" / f"lowered_{target}.onnx")
        result.save(out)
        st = os.lstat(out + ".data")
        assert st.st_nlink == 1 and not os.path.islink(out + ".data")
        assert {t.external_data[0].value for t in onnx.load(out, load_external_data=False).graph.initializer
                if t.data_location == T.EXTERNAL} == {f"lowered_{target}.onnx.data"}
        assert_written_well(out, target, src)
    assert {p: d for p, d in tree_digest(tmp_path / "in").items() if "lowered" not in p} == before


def test_optimize_says_it_wrote_a_data_file(tmp_path, capsys, monkeypatch):
    """The summary and --json name the data file beside the output (2 GiB a user must ship with
    it), and only when this run wrote it: a stale one from an earlier run is not claimed."""
    src = export(tmp_path / "in", "one_file")
    out = tmp_path / "out.onnx"
    (tmp_path / "out.onnx.data").write_bytes(b"stale")
    code, o, e = run_cli(["optimize", src, "-o", out, "--json"], capsys)
    assert_ok(code, o, e)
    assert json.loads(o)["external_data"] is None
    monkeypatch.setattr(saving, "_EXTERNAL_THRESHOLD", 1000)
    code, o, e = run_cli(["optimize", src, "-o", out], capsys)
    assert_ok(code, o, e)
    assert o.splitlines()[-1].startswith(f"wrote {out} and its weights, {out}.data (") and "KiB)" in o
    code, o, e = run_cli(["optimize", src, "-o", out, "--json"], capsys)
    report = json.loads(o)
    assert report["external_data"] == f"{out}.data"
    assert report["after"]["data_file_bytes"] == os.path.getsize(f"{out}.data")


def test_the_output_never_replaces_the_inputs_external_data(tmp_path, capsys, monkeypatch):
    """The output (or its data file) named as one of the input's data files would destroy the input
    (it was written, and the input no longer loaded): refused with exit 2, nothing written."""
    src = export(tmp_path, "one_file")
    before = tree_digest(tmp_path)
    assert_clean_error(*run_cli(["optimize", src, "-o", tmp_path / "model.onnx.data"], capsys),
                       "external data")
    monkeypatch.setattr(saving, "_EXTERNAL_THRESHOLD", 1000)  # the output gets `model.onnx.data` beside it
    other = tmp_path / "other.onnx"
    shutil.copy(src, other)
    before = tree_digest(tmp_path)
    assert_clean_error(*run_cli(["optimize", other, "-o", tmp_path / "model.onnx"], capsys), "external data")
    assert tree_digest(tmp_path) == before


def test_in_place_rewrites_the_model_and_its_data(tmp_path, capsys, monkeypatch):
    """--in-place replaces the input model, its data file included (it is the same model)."""
    src = export(tmp_path, "one_file")
    want = ort_run(src, feeds())
    monkeypatch.setattr(saving, "_EXTERNAL_THRESHOLD", 1000)
    assert_ok(*run_cli(["optimize", src, "-o", src, "--in-place", "--target", "onnx"], capsys))
    onnx.checker.check_model(src, full_check=True)
    for a, b in zip(want, ort_run(src, feeds()), strict=True):
        np.testing.assert_array_equal(a, b)


# ---- over 2 GiB, opt-in -------------------------------------------------------------------------
BIG_WEIGHT = (8192, 8192)  # float32: 256 MiB each
BIG_LAYERS = 9  # 2.25 GiB in all, as the 602M-parameter decoder of issue 26


def export_big(folder) -> str:
    """`model.onnx` + `model.onnx.data` (the dynamo exporter's layout) of 2.25 GiB, as a sparse file:
    each weight's first row is written (so no weight looks like a band), the rest is a hole."""
    path = os.path.join(folder, "model.onnx")
    data = os.path.join(folder, "model.onnx.data")
    nbytes = BIG_WEIGHT[0] * BIG_WEIGHT[1] * 4
    weights = []
    with open(data, "wb") as f:
        for i in range(BIG_LAYERS):
            f.seek(i * nbytes)
            f.write((np.arange(BIG_WEIGHT[1], dtype=np.float32) % 7 * np.float32(0.01)).tobytes())
            w = T(name=f"layers.{i}.weight", data_type=T.FLOAT, dims=list(BIG_WEIGHT), data_location=T.EXTERNAL)
            for key, value in (("location", "model.onnx.data"), ("offset", i * nbytes), ("length", nbytes)):
                w.external_data.add(key=key, value=str(value))
            weights.append(w)
        f.truncate(BIG_LAYERS * nbytes)
    with open(path, "wb") as f:
        f.write(decoder(BIG_WEIGHT[0], weights=weights).SerializeToString())
    return path


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("DMLGRAPH_BIG_TESTS"), reason="writes 2 x 2.25 GiB; DMLGRAPH_BIG_TESTS=1")
@pytest.mark.parametrize("where", ["other_folder", "same_folder"])
def test_a_model_over_2_gib(where, tmp_path):
    """optimize of 2.25 GiB of external weights, both targets, in a process of its own: exit 0,
    the input untouched, `out.onnx` + `out.onnx.data` that pass onnx's checker from their path and
    load in onnxruntime (the portable target). Prints the time and the peak RSS."""
    folder = tmp_path / "in"
    os.makedirs(folder)
    try:
        src = export_big(folder)
        stat_before = [(p, os.stat(os.path.join(folder, p)).st_mtime_ns) for p in sorted(os.listdir(folder))]
        out_dir = folder if where == "same_folder" else tmp_path / "out"
        os.makedirs(out_dir, exist_ok=True)
        for target in ("dml", "onnx"):
            out = str(out_dir / f"lowered_{target}.onnx")
            code = ("import sys, time; from dmlgraph.tools import cli; t = time.perf_counter(); "
                    "c = cli.main(sys.argv[1:]); print('SECONDS', time.perf_counter() - t); "
                    "print('PEAK_RSS', [s for s in open('/proc/self/status') if s.startswith('VmHWM')][0]); sys.exit(c)")
            # (VmHWM: ru_maxrss would carry this process's peak across the exec)
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-c", code, "optimize", src, "-o", out, "--target", target],
                                  cwd=tmp_path, capture_output=True, text=True)
            assert proc.returncode == 0, proc.stderr
            print(f"{where} {target}: {time.perf_counter() - t0:.1f} s in all;",
                  " ".join(line for line in proc.stdout.splitlines() if line.startswith(("SECONDS", "PEAK"))))
            assert os.path.getsize(out + ".data") >= BIG_LAYERS * BIG_WEIGHT[0] * BIG_WEIGHT[1] * 4
            onnx.checker.check_model(out, full_check=True)
            if target == "onnx":
                ort.InferenceSession(out, providers=["CPUExecutionProvider"])
            os.unlink(out)
            os.unlink(out + ".data")
        assert [(p, os.stat(os.path.join(folder, p)).st_mtime_ns) for p in sorted(os.listdir(folder))] == stat_before
    finally:
        shutil.rmtree(tmp_path)
