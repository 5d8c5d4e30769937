"""Model file I/O: every bad input is a ModelError, external data is confined and mapped, writes are atomic."""
from __future__ import annotations

import os
import random

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from dmlgraph.errors import ModelError
from dmlgraph.io import modelfile, saving
from dmlgraph.io.modelfile import load_model, read_tensor, tensor_nbytes
from dmlgraph.io.saving import save_model


def make_model(nodes=None, inits=None, inputs=None, outputs=None, **graph_kw) -> onnx.ModelProto:
    if nodes is None:
        nodes = [h.make_node("Add", ["x", "w"], ["a"], name="add"), h.make_node("Relu", ["a"], ["y"], name="relu")]
    if inits is None:
        inits = [numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")]
    inputs = inputs or [h.make_tensor_value_info("x", T.FLOAT, [2, 3])]
    outputs = outputs or [h.make_tensor_value_info("y", T.FLOAT, [2, 3])]
    g = h.make_graph(nodes, "g", inputs, outputs, inits, **graph_kw)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


def write(model: onnx.ModelProto, path) -> str:
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return str(path)


def external_tensor(name, shape, dtype, location, offset=None, length=None) -> T:
    t = T()
    t.name = name
    t.data_type = dtype
    t.dims.extend(shape)
    t.data_location = T.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        if value is not None:
            e = t.external_data.add()
            e.key, e.value = key, str(value)
    return t


def external_model(tmp_path, location="w.bin", offset=0, length=24, file_bytes=None, name="m.onnx"):
    """A model whose initializer 'w' (2x3 float32) is external; writes w.bin unless told otherwise."""
    if file_bytes is None:
        file_bytes = np.arange(6, dtype=np.float32).tobytes()
    if file_bytes is not False:
        (tmp_path / "w.bin").write_bytes(file_bytes)
    w = external_tensor("w", [2, 3], T.FLOAT, location, offset, length)
    return write(make_model(inits=[w]), tmp_path / name)


def expect_error(path, *words, **kw) -> str:
    with pytest.raises(ModelError) as info:
        load_model(path, **kw)
    msg = str(info.value)
    for word in words:
        assert word in msg, msg
    return msg


# ---------------------------------------------------------------- bad files


def test_valid_model_loads(tmp_path):
    m = load_model(write(make_model(), tmp_path / "m.onnx"))
    assert [n.op_type for n in m.graph.node] == ["Add", "Relu"]


def test_missing_file(tmp_path):
    expect_error(tmp_path / "nope.onnx", "not found", "nope.onnx")


def test_directory(tmp_path):
    expect_error(tmp_path, "is a directory", str(tmp_path))


def test_empty_file(tmp_path):
    p = tmp_path / "empty.onnx"
    p.write_bytes(b"")
    expect_error(p, "empty", "empty.onnx")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root can read anything")
def test_unreadable_file(tmp_path):
    p = write(make_model(), tmp_path / "m.onnx")
    os.chmod(p, 0)
    try:
        expect_error(p, "cannot read", "m.onnx")
    finally:
        os.chmod(p, 0o644)


def test_fifo_is_refused_without_hanging(tmp_path):
    p = tmp_path / "fifo.onnx"
    os.mkfifo(p)
    expect_error(p, "not a regular file")


def test_random_bytes(tmp_path):
    p = tmp_path / "junk.onnx"
    p.write_bytes(bytes(random.Random(1).randrange(256) for _ in range(4096)))
    msg = expect_error(p, "junk.onnx", "is not a valid ONNX model")
    assert "complete?" in msg


def test_garbage_that_parses_as_empty_model(tmp_path):
    # A lone varint field parses as a ModelProto with only ir_version set.
    p = tmp_path / "tiny.onnx"
    p.write_bytes(b"\x08\x07")
    expect_error(p, "is not a valid ONNX model", "graph", "opset_import")


def test_truncated_model_at_every_cut(tmp_path):
    data = make_model().SerializeToString()
    p = tmp_path / "cut.onnx"
    for cut in range(1, len(data)):
        p.write_bytes(data[:cut])
        expect_error(p, "cut.onnx", "not a valid ONNX model")


def test_huge_file_is_refused_before_reading(tmp_path):
    p = tmp_path / "big.onnx"
    with open(p, "wb") as f:
        f.truncate(2**31 + 10)  # sparse: no disk used, never read
    expect_error(p, "2 GiB", "external data")


# ---------------------------------------------------------------- invalid graphs


def test_checker_failure_unknown_op(tmp_path):
    m = make_model(nodes=[h.make_node("NoSuchOp", ["x", "w"], ["y"])])
    msg = expect_error(write(m, tmp_path / "m.onnx"), "ONNX checker", "No Op registered for NoSuchOp")
    assert "Context" not in msg  # only the checker's first line
    load_model(tmp_path / "m.onnx", check=False)  # still parseable when asked


def test_dangling_input(tmp_path):
    m = make_model(nodes=[h.make_node("Add", ["x", "ghost"], ["y"], name="add")])
    expect_error(write(m, tmp_path / "m.onnx"), "'ghost'", "dangling", "node 'add'")


def test_cycle(tmp_path):
    nodes = [h.make_node("Add", ["x", "b"], ["a"], name="n1"),
             h.make_node("Add", ["x", "a"], ["b"], name="n2"),
             h.make_node("Relu", ["a"], ["y"], name="n3")]
    expect_error(write(make_model(nodes=nodes, inits=[]), tmp_path / "m.onnx"), "cycle", "n1", "n2")


def test_misordered_nodes_are_taken_as_onnxruntime_takes_them(tmp_path, monkeypatch):
    """onnx's checker refuses nodes out of topological order; onnxruntime sorts and runs them, so
    dmlgraph takes them with a note. Where onnxruntime refused too, the error says what is wrong
    (misordered, not a cycle)."""
    nodes = [h.make_node("Relu", ["a"], ["y"], name="late"), h.make_node("Neg", ["x"], ["a"], name="early")]
    path = write(make_model(nodes=nodes, inits=[]), tmp_path / "m.onnx")
    with pytest.raises(onnx.checker.ValidationError, match="topological"):
        onnx.checker.check_model(path)
    notes: list[str] = []
    load_model(path, notes=notes)
    assert len(notes) == 1 and "onnxruntime loads it" in notes[0]
    monkeypatch.setattr(modelfile, "onnxruntime_refuses", lambda *a, **k: "refused")
    msg = expect_error(path, "topological order")
    assert "cycle" not in msg


def test_dangling_input_inside_subgraph(tmp_path):
    then_g = h.make_graph([h.make_node("Identity", ["ghost"], ["t"])], "then", [],
                          [h.make_tensor_value_info("t", T.FLOAT, [2, 3])])
    else_g = h.make_graph([h.make_node("Identity", ["x"], ["e"])], "else", [],
                          [h.make_tensor_value_info("e", T.FLOAT, [2, 3])])
    nodes = [h.make_node("If", ["c"], ["y"], name="branch", then_branch=then_g, else_branch=else_g)]
    m = make_model(nodes=nodes, inits=[], inputs=[h.make_tensor_value_info("x", T.FLOAT, [2, 3]),
                                                  h.make_tensor_value_info("c", T.BOOL, [])])
    expect_error(write(m, tmp_path / "m.onnx"), "'ghost'", "then_branch", "branch")


def test_raw_data_too_short(tmp_path):
    w = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    w.raw_data = w.raw_data[:10]
    expect_error(write(make_model(inits=[w]), tmp_path / "m.onnx"), "'w'", "10 bytes", "24")


def test_typed_field_too_short(tmp_path):
    w = h.make_tensor("w", T.FLOAT, [2, 3], [1.0] * 6)
    del w.float_data[2:]  # 2 values for 6 elements
    expect_error(write(make_model(inits=[w]), tmp_path / "m.onnx"), "'w'", "float_data", "2 values")


def test_raw_data_too_short_in_subgraph_initializer(tmp_path):
    bad = numpy_helper.from_array(np.ones(4, np.float32), "k")
    bad.raw_data = b"\0" * 3
    body = h.make_graph([h.make_node("Identity", ["k"], ["t"])], "then", [],
                        [h.make_tensor_value_info("t", T.FLOAT, [4])], [bad])
    els = h.make_graph([h.make_node("Identity", ["x"], ["e"])], "else", [],
                       [h.make_tensor_value_info("e", T.FLOAT, [4])])
    nodes = [h.make_node("If", ["c"], ["y"], then_branch=body, else_branch=els)]
    m = make_model(nodes=nodes, inits=[], inputs=[h.make_tensor_value_info("x", T.FLOAT, [4]),
                                                  h.make_tensor_value_info("c", T.BOOL, [])],
                   outputs=[h.make_tensor_value_info("y", T.FLOAT, [4])])
    expect_error(write(m, tmp_path / "m.onnx"), "'k'", "subgraph 'then_branch'", check=False)


def test_negative_dims(tmp_path):
    w = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    w.dims[0] = -2
    expect_error(write(make_model(inits=[w]), tmp_path / "m.onnx"), "'w'", "negative", check=False)


def test_absurd_shape(tmp_path):
    w = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    w.dims[:] = [2**21, 2**21, 2]
    expect_error(write(make_model(inits=[w]), tmp_path / "m.onnx"), "'w'", "2^40", check=False)


# ---------------------------------------------------------------- external data


def test_external_model_loads_lazily_and_maps(tmp_path):
    p = external_model(tmp_path)
    m = load_model(p)
    w = m.graph.initializer[0]
    assert w.data_location == T.EXTERNAL and not w.raw_data  # nothing read into the proto
    assert tensor_nbytes(w) == 24
    arr = read_tensor(w, tmp_path)
    assert isinstance(arr, np.memmap) and not arr.flags.writeable
    np.testing.assert_array_equal(arr, np.arange(6, dtype=np.float32).reshape(2, 3))
    full = load_model(p, load_external_data=True)
    assert full.graph.initializer[0].raw_data == np.arange(6, dtype=np.float32).tobytes()


def test_external_with_offset_and_without_length(tmp_path):
    payload = b"\xff" * 8 + np.arange(6, dtype=np.float32).tobytes()
    p = external_model(tmp_path, offset=8, length=None, file_bytes=payload)
    arr = read_tensor(load_model(p).graph.initializer[0], tmp_path)
    np.testing.assert_array_equal(arr.ravel(), np.arange(6, dtype=np.float32))


def test_external_absolute_location(tmp_path):
    expect_error(external_model(tmp_path, location="/etc/passwd"), "'w'", "absolute", "/etc/passwd")


@pytest.mark.parametrize("loc", ["../x", "../../etc/passwd", "sub/../../x", "..\\x"])
def test_external_dotdot_location(tmp_path, loc):
    expect_error(external_model(tmp_path, location=loc), "'w'", "escapes the model's folder", "..")


def test_external_symlink_out_of_folder(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.bin").write_bytes(b"\0" * 24)
    folder = tmp_path / "model"
    folder.mkdir()
    os.symlink(outside / "secret.bin", folder / "w.bin")
    expect_error(external_model(folder, file_bytes=False), "'w'", "outside the model's folder", "w.bin")
    # read_tensor applies the same checks to a tensor it is handed directly
    t = external_tensor("w", [2, 3], T.FLOAT, "w.bin", 0, 24)
    with pytest.raises(ModelError, match="outside"):
        read_tensor(t, folder)


def test_external_symlink_inside_folder_is_fine(tmp_path):
    (tmp_path / "real.bin").write_bytes(np.arange(6, dtype=np.float32).tobytes())
    os.symlink("real.bin", tmp_path / "link.bin")
    p = external_model(tmp_path, location="link.bin", file_bytes=False)
    assert read_tensor(load_model(p).graph.initializer[0], tmp_path)[1, 2] == 5


@pytest.mark.parametrize("where", ["subgraph initializer", "Constant attribute"])
def test_external_escape_in_subgraph_or_constant_is_refused(tmp_path, where):
    bad = external_tensor("k", [2, 3], T.FLOAT, "../../etc/passwd", 0, 24)
    if where == "subgraph initializer":
        body = [h.make_node("Identity", ["k"], ["t"])]
        inits, words = [bad], ("initializer 'k'", "subgraph 'then_branch'", "escapes")
    else:
        body = [h.make_node("Constant", [], ["t"], name="const", value=bad)]
        inits, words = [], ("attribute 'value' of node 'const'", "subgraph 'then_branch'", "escapes")
    then_g = h.make_graph(body, "then", [], [h.make_tensor_value_info("t", T.FLOAT, [2, 3])], inits)
    else_g = h.make_graph([h.make_node("Neg", ["x"], ["e"])], "else", [],
                          [h.make_tensor_value_info("e", T.FLOAT, [2, 3])])
    nodes = [h.make_node("If", ["c"], ["y"], name="branch", then_branch=then_g, else_branch=else_g)]
    m = make_model(nodes=nodes, inits=[], inputs=[h.make_tensor_value_info("x", T.FLOAT, [2, 3]),
                                                  h.make_tensor_value_info("c", T.BOOL, [])])
    expect_error(write(m, tmp_path / "m.onnx"), *words, check=False)


def test_external_missing_file(tmp_path):
    expect_error(external_model(tmp_path, file_bytes=False), "'w'", "missing", "w.bin")


def test_external_past_eof(tmp_path):
    expect_error(external_model(tmp_path, offset=8, length=24), "'w'", "past the end", "w.bin")


def test_external_length_disagrees_with_shape(tmp_path):
    expect_error(external_model(tmp_path, length=16), "'w'", "length 16", "24")


def test_external_bad_offset(tmp_path):
    expect_error(external_model(tmp_path, offset=-4), "'w'", "offset", "non-negative")


def test_external_directory_location(tmp_path):
    (tmp_path / "d").mkdir()
    expect_error(external_model(tmp_path, location="d", file_bytes=False), "'w'", "not a regular file")


# ---------------------------------------------------------------- saving


def test_save_roundtrip_and_determinism(tmp_path):
    m = make_model()
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    save_model(m, a)
    save_model(load_model(a), b)
    save_model(m, tmp_path / "c.onnx")
    assert a.read_bytes() == b.read_bytes() == (tmp_path / "c.onnx").read_bytes()
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_save_refuses_overwriting_input(tmp_path, monkeypatch):
    p = write(make_model(), tmp_path / "m.onnx")
    before = open(p, "rb").read()
    os.symlink(p, tmp_path / "link.onnx")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    for spelling in (p, "../m.onnx", str(tmp_path / "sub" / ".." / "m.onnx"), str(tmp_path / "link.onnx")):
        with pytest.raises(ModelError, match="--in-place"):
            save_model(make_model(nodes=[h.make_node("Identity", ["x"], ["y"])], inits=[]), spelling,
                       input_path=p)
    assert open(p, "rb").read() == before
    os.link(p, tmp_path / "hard.onnx")
    with pytest.raises(ModelError, match="refusing to overwrite"):
        save_model(make_model(), tmp_path / "hard.onnx", input_path=p)
    new = make_model(nodes=[h.make_node("Identity", ["x"], ["y"])], inits=[])
    save_model(new, "../m.onnx", input_path=p, in_place=True)
    assert load_model(p).graph.node[0].op_type == "Identity"


def test_save_refuses_missing_folder(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        save_model(make_model(), tmp_path / "no" / "m.onnx")


def test_save_failure_mid_write_leaves_prior_output(tmp_path, monkeypatch):
    out = tmp_path / "out.onnx"
    save_model(make_model(), out)
    before = out.read_bytes()

    def half_then_fail(f, data):
        f.write(data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(saving, "write_bytes", half_then_fail)
    other = make_model(nodes=[h.make_node("Identity", ["x"], ["y"])], inits=[])
    with pytest.raises(ModelError, match="No space left"):
        save_model(other, out)
    with pytest.raises(ModelError, match="No space left"):
        save_model(other, out, external_data=True)
    with pytest.raises(ModelError):
        save_model(other, tmp_path / "fresh.onnx")
    assert out.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["out.onnx"]


def test_save_failure_at_rename_and_interrupt(tmp_path, monkeypatch):
    out = tmp_path / "out.onnx"
    save_model(make_model(), out)
    before = out.read_bytes()
    monkeypatch.setattr(modelfile.os, "replace", lambda *a: (_ for _ in ()).throw(OSError("boom")))
    with pytest.raises(ModelError, match="boom"):
        save_model(make_model(inits=[]), out)
    monkeypatch.undo()

    def interrupted(model, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(onnx.ModelProto, "SerializeToString", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_model(make_model(inits=[]), out)
    monkeypatch.undo()
    assert out.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["out.onnx"]


def _big_model() -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    b = np.arange(4, dtype=np.float32)  # small: stays inline
    nodes = [h.make_node("MatMul", ["x", "w"], ["a"]), h.make_node("ReduceSum", ["a"], ["s"], keepdims=0),
             h.make_node("Add", ["s", "b"], ["y"])]
    m = make_model(nodes=nodes, inits=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
                   inputs=[h.make_tensor_value_info("x", T.FLOAT, [4, 64])],
                   outputs=[h.make_tensor_value_info("y", T.FLOAT, [4])])
    return m, w, b


def test_external_data_roundtrip_runs_in_ort(tmp_path):
    import onnxruntime as ort

    m, w, b = _big_model()
    original = m.SerializeToString()
    out = tmp_path / "ext.onnx"
    save_model(m, out, external_data=True)
    assert m.SerializeToString() == original  # caller's model untouched
    assert (tmp_path / "ext.onnx.data").stat().st_size == w.nbytes
    loaded = load_model(out)
    inits = {t.name: t for t in loaded.graph.initializer}
    assert inits["w"].data_location == T.EXTERNAL and inits["b"].data_location != T.EXTERNAL
    np.testing.assert_array_equal(read_tensor(inits["w"], tmp_path), w)
    np.testing.assert_array_equal(read_tensor(inits["b"], tmp_path), b)
    x = np.ones((4, 64), np.float32)
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, (x @ w).sum() + b, rtol=1e-5)

    # Copy the external model elsewhere (streaming from the source data file), twice: same bytes.
    (tmp_path / "copy").mkdir()
    for name in ("c1.onnx", "c2.onnx"):
        save_model(loaded, tmp_path / "copy" / name, external_data=True, base_dir=tmp_path)
    c1, c2 = tmp_path / "copy" / "c1.onnx", tmp_path / "copy" / "c2.onnx"
    assert c1.read_bytes().replace(b"c1", b"c2") == c2.read_bytes()
    assert (tmp_path / "copy" / "c1.onnx.data").read_bytes() == (tmp_path / "copy" / "c2.onnx.data").read_bytes()
    again = load_model(c1)
    np.testing.assert_array_equal(read_tensor(again.graph.initializer[0], tmp_path / "copy"), w)

    # Back to a single file: external bytes are inlined.
    single = tmp_path / "single.onnx"
    save_model(loaded, single, external_data=False, base_dir=tmp_path)
    np.testing.assert_array_equal(numpy_helper.to_array(load_model(single).graph.initializer[0]), w)

    with pytest.raises(ModelError, match="base_dir"):
        save_model(loaded, tmp_path / "nobase.onnx")


def test_in_place_rewrite_of_external_model(tmp_path):
    m, w, _ = _big_model()
    p = tmp_path / "m.onnx"
    save_model(m, p, external_data=True)
    loaded = load_model(p)
    loaded.graph.doc_string = "rewritten"
    # Source data file and output data file are the same path: streamed into a temp file first.
    save_model(loaded, p, input_path=p, in_place=True, external_data=True, base_dir=tmp_path)
    again = load_model(p)
    assert again.graph.doc_string == "rewritten"
    np.testing.assert_array_equal(read_tensor(again.graph.initializer[0], tmp_path), w)
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data"]


def test_external_data_chosen_by_size(tmp_path, monkeypatch):
    m, w, _ = _big_model()
    monkeypatch.setattr(saving, "_EXTERNAL_THRESHOLD", 1000)
    save_model(m, tmp_path / "auto.onnx")
    assert (tmp_path / "auto.onnx.data").stat().st_size == w.nbytes
    with pytest.raises(ModelError, match="external data"):
        save_model(m, tmp_path / "single.onnx", external_data=False)
    assert not (tmp_path / "single.onnx").exists()


def test_save_refuses_unsafe_source_external_data(tmp_path):
    t = external_tensor("w", [2, 3], T.FLOAT, "../escape.bin", 0, 24)
    with pytest.raises(ModelError, match="escapes"):
        save_model(make_model(inits=[t]), tmp_path / "o.onnx", base_dir=tmp_path)
    assert not os.listdir(tmp_path)


def test_tensor_nbytes():
    assert tensor_nbytes(numpy_helper.from_array(np.zeros((3, 5), np.float16))) == 30
    assert tensor_nbytes(external_tensor("w", [2, 3], T.FLOAT, "w.bin")) == 24
    assert tensor_nbytes(h.make_tensor("s", T.STRING, [2], [b"ab", b"cde"])) == 5
    assert tensor_nbytes(external_tensor("q", [5], T.INT4, "q.bin")) == 3
    bad = numpy_helper.from_array(np.zeros(2, np.float32))
    bad.dims[0] = -1
    with pytest.raises(ModelError):
        tensor_nbytes(bad)


# ---------------------------------------------------------------- fuzz


def test_fuzz_mutants_never_crash(tmp_path):
    m, _, _ = _big_model()
    m.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.ones((64, 2), np.float32), "w"))
    data = bytearray(m.SerializeToString())
    rng = random.Random(20240611)
    p = tmp_path / "fuzz.onnx"
    outcomes = {"loaded": 0, "ModelError": 0}
    n_mutants = 200
    for _ in range(n_mutants):
        mutant = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            kind = rng.choice(("flip", "byte", "truncate", "insert", "delete"))
            pos = rng.randrange(len(mutant))
            if kind == "flip":
                mutant[pos] ^= 1 << rng.randrange(8)
            elif kind == "byte":
                mutant[pos] = rng.randrange(256)
            elif kind == "truncate":
                del mutant[pos:]
            elif kind == "insert":
                mutant[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
            else:
                del mutant[pos:pos + rng.randint(1, 8)]
            if not mutant:
                mutant = bytearray(b"\x00")
        p.write_bytes(bytes(mutant))
        try:
            load_model(p)
            outcomes["loaded"] += 1
        except ModelError:
            outcomes["ModelError"] += 1
    assert sum(outcomes.values()) == n_mutants
    print(f"fuzz (inline model, check=True): {n_mutants} mutants -> {outcomes}")


def test_fuzz_external_model_mutants_never_crash(tmp_path):
    """Mutate a model with external data; loaded mutants must also read (or refuse) every tensor."""
    m, _, _ = _big_model()
    save_model(m, tmp_path / "ext.onnx", external_data=True)
    data = bytearray((tmp_path / "ext.onnx").read_bytes())
    rng = random.Random(7)
    p = tmp_path / "ext.onnx"
    outcomes = {"loaded": 0, "ModelError": 0}
    n_mutants = 200
    for _ in range(n_mutants):
        mutant = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(len(mutant))
            if rng.random() < 0.7:
                mutant[pos] = rng.randrange(256)
            else:
                del mutant[pos:pos + rng.randint(1, 4)]
        p.write_bytes(bytes(mutant))
        try:
            loaded = load_model(p, check=False)
            for t in loaded.graph.initializer:
                read_tensor(t, tmp_path)
                tensor_nbytes(t)
            outcomes["loaded"] += 1
        except ModelError:
            outcomes["ModelError"] += 1
    assert sum(outcomes.values()) == n_mutants
    print(f"fuzz (external model, check=False, read_tensor): {n_mutants} mutants -> {outcomes}")


# ---- UTF-8 of string fields: the proto3 twin (fast) and the walk (which names the field) agree ----
def _marked_model() -> onnx.ModelProto:
    """Strings marked ZZZ<i> in every kind of place: names, op/domain, dim_param, doc strings,
    metadata, and a node inside an If branch."""
    branch = h.make_graph([h.make_node("Relu", ["x"], ["t"], name="ZZZ1")], "ZZZ2", [],
                          [h.make_tensor_value_info("t", T.FLOAT, ["ZZZ3", 3])])
    nodes = [h.make_node("Constant", [], ["c"], value=h.make_tensor("ZZZ4", T.BOOL, [], [True])),
             h.make_node("If", ["c"], ["y"], name="ZZZ5", then_branch=branch, else_branch=branch,
                         doc_string="ZZZ6")]
    m = make_model(nodes, [], [h.make_tensor_value_info("x", T.FLOAT, ["ZZZ7", 3])],
                   [h.make_tensor_value_info("y", T.FLOAT, ["ZZZ8", 3])])
    h.set_model_props(m, {"ZZZ9": "value"})
    m.producer_name = "ZZZA"
    return m


@pytest.mark.parametrize("marker", [f"ZZZ{c}" for c in "123456789A"])
def test_bad_utf8_anywhere_is_refused_by_the_twin_and_named_by_the_walk(tmp_path, marker):
    data = _marked_model().SerializeToString()
    assert data.count(marker.encode()) >= 1
    bad = data.replace(marker.encode(), b"\xff\xfe" + marker.encode()[2:])
    parsed = onnx.ModelProto.FromString(bad)  # proto2 parses it
    # Given the bytes, the proto3 twin parses them and, when it accepts them, nothing else is checked:
    # so this refusal is the twin's. Without the bytes, it is the walk's alone.
    with pytest.raises(ModelError, match="not valid UTF-8"):
        modelfile.check_model_proto(parsed, "m.onnx", None, check=False, data=bad)
    with pytest.raises(ModelError, match="not valid UTF-8"):
        modelfile.check_model_proto(parsed, "m.onnx", None, check=False)  # the walk alone
    with pytest.raises(ModelError, match="not valid UTF-8"):
        load_model(write_bytes(tmp_path / "m.onnx", bad))


def write_bytes(path, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def test_the_twin_accepts_every_corpus_model():
    import glob
    paths = glob.glob(os.path.join(os.path.dirname(__file__), "..", "models", "**", "*.onnx"), recursive=True)
    assert len(paths) >= 20
    for p in paths:
        with open(p, "rb") as f:
            modelfile.utf8_twin().FromString(f.read())


def test_data_nbytes_agrees_with_tensor_nbytes_on_every_corpus_initializer():
    """The stats read sizes from type and shape; tensor_nbytes reads the tensor (the oracle)."""
    import glob
    checked = 0
    for p in glob.glob(os.path.join(os.path.dirname(__file__), "..", "models", "**", "*.onnx"), recursive=True):
        for t in load_model(p).graph.initializer:
            if t.data_type != T.STRING:
                assert modelfile.data_nbytes(t.data_type, t.dims) == tensor_nbytes(t), (p, t.name)
                checked += 1
    assert checked > 100
    for dt, dims, want in [(T.INT4, [5], 3), (T.BOOL, [2, 3], 6), (T.FLOAT16, [], 2), (T.DOUBLE, [0, 4], 0)]:
        assert modelfile.data_nbytes(dt, dims) == want


def _num_elements_oracle(dims):
    n = 1
    for d in dims:
        if d < 0:
            return "negative"
        n *= d
        if n > 2**40:
            return "absurd"
    return n


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.integers(-3, 70), st.sampled_from([0, 2**20, 2**21, 2**40, 2**41, 2**62])), max_size=5))
def test_num_elements_fast_path_matches_the_checked_loop(dims):
    """The element count the size checks use (a fast product, else a checked loop) is the oracle's:
    an initializer with no data is refused as needing exactly that many values, or as corrupt."""
    t = T(name="t", data_type=T.FLOAT, dims=dims)
    m = h.make_model(h.make_graph([], "g", [], [], [t]), opset_imports=[h.make_opsetid("", 17)])
    want = _num_elements_oracle(dims)
    if isinstance(want, str):
        with pytest.raises(ModelError, match=want):
            modelfile.check_model_proto(m, "m", None, check=False)
    elif want == 0:
        modelfile.check_model_proto(m, "m", None, check=False)
    else:
        with pytest.raises(ModelError, match=rf"float_data holds 0 values but its shape .* needs {want}(\s|$)"):
            modelfile.check_model_proto(m, "m", None, check=False)


# ---- weightless views for the checker and shape inference -----------------------------------
def _weighty_model(bad_op: bool = False) -> onnx.ModelProto:
    """A big float weight (256 KiB), a Constant weight, a small int shape read by Reshape."""
    w = numpy_helper.from_array(np.arange(256 * 256, dtype=np.float32).reshape(256, 256), "w")
    shape = numpy_helper.from_array(np.array([2, -1], np.int64), "shape")
    nodes = [h.make_node("MatMul", ["x", "w"], ["a"]),
             h.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.ones((256, 256), np.float32))),
             h.make_node("Add", ["a", "c"], ["b"]),
             h.make_node("Reshape" if not bad_op else "NoSuchOp", ["b", "shape"], ["r"]),
             h.make_node("Relu", ["r"], ["y"])]
    return make_model(nodes, [w, shape], [h.make_tensor_value_info("x", T.FLOAT, [256, 256])],
                      [h.make_tensor_value_info("y", T.FLOAT, [2, 32768])])


def test_without_weights_keeps_shapes_and_leaves_the_model_alone():
    from dmlgraph.io.shape_inference import infer_shapes
    m = _weighty_model()
    before = m.SerializeToString()
    view = modelfile.without_weights(m, keep_dims=True)
    assert m.SerializeToString() == before
    big = {t.name: t for t in view.graph.initializer}
    assert not big["w"].HasField("raw_data") and list(big["w"].dims) == [256, 256]
    assert big["shape"].HasField("raw_data")  # small index vectors keep their values
    const = view.graph.node[1].attribute[0].t
    assert not const.HasField("raw_data") and list(const.dims) == [256, 256]
    full = onnx.shape_inference.infer_shapes(m, data_prop=True)
    shapes = lambda model: {vi.name: vi.type.SerializeToString()
                            for vi in list(model.graph.value_info) + list(model.graph.output)}
    assert shapes(infer_shapes(m)) == shapes(full)
    r = [vi for vi in infer_shapes(m).graph.value_info if vi.name == "r"][0]
    assert [d.dim_value for d in r.type.tensor_type.shape.dim] == [2, 32768]  # from the kept int constant
    small = make_model()
    assert modelfile.without_weights(small, keep_dims=True) is small  # nothing to leave out: no copy


def test_checker_sees_a_weightless_view_and_still_catches_errors(tmp_path):
    load_model(write(_weighty_model(), tmp_path / "ok.onnx"))
    with pytest.raises(ModelError, match="ONNX checker"):
        load_model(write(_weighty_model(bad_op=True), tmp_path / "bad.onnx"))


def _small_model(bad_op: bool = False) -> onnx.ModelProto:
    return make_model(nodes=[h.make_node("Add", ["x", "w"], ["a"]), h.make_node("NoSuchOp" if bad_op else "Relu",
                                                                                  ["a"], ["y"])])


@pytest.mark.parametrize("weighty", [False, True])
def test_check_for_save_agrees_with_the_full_check(weighty):
    """A model without weights to leave out is checked from its bytes in one call, which are
    returned; one with weights by the split check on views. Both refuse what full_check refuses:
    a checker error, and a shape only strict inference finds wrong."""
    from dmlgraph.errors import InternalError
    model = _weighty_model if weighty else _small_model
    ok = model()
    assert saving.check_for_save(ok) == (None if weighty else ok.SerializeToString(deterministic=True))
    wrong_shape = model()
    wrong_shape.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 5
    onnx.checker.check_model(wrong_shape)  # (only the full check sees it)
    for bad in (model(bad_op=True), wrong_shape):
        with pytest.raises((onnx.checker.ValidationError, onnx.shape_inference.InferenceError)):
            onnx.checker.check_model(bad, full_check=True)
        with pytest.raises(InternalError, match="fails the ONNX checker"):
            saving.check_for_save(bad)


@pytest.mark.parametrize("where", ["none", "none, its bytes in data", "initializer", "sparse values", "Constant value",
                                   "Constant tensors", "subgraph initializer", "subgraph Constant", "nested subgraph"])
def test_any_external_agrees_with_the_labelled_walk(where):
    """save_model asks `any_external` (one pass, no labels) before walking `iter_tensors` (the oracle)."""
    ext = external_tensor("k", [2, 3], T.FLOAT, "w.bin", 0, 24)
    inline = numpy_helper.from_array(np.ones((2, 3), np.float32), "k")
    t = ext if not where.startswith("none") else inline
    if where == "none, its bytes in data":  # int64 368 is the bytes 0x70 0x01 that mark external data
        t = numpy_helper.from_array(np.full((2, 3), 368, np.int64), "k")
    inits, sparse, body_inits, body_nodes = [], [], [], [h.make_node("Identity", ["x"], ["t"])]
    if where == "initializer" or where.startswith("none"):
        inits = [t]
    elif where == "sparse values":
        sparse = [h.make_sparse_tensor(external_tensor("sv", [1], T.FLOAT, "w.bin", 0, 4),
                                       numpy_helper.from_array(np.array([0], np.int64), "si"), [2, 3])]
    elif where == "subgraph initializer":
        body_inits = [t]
    elif where in ("subgraph Constant", "nested subgraph"):
        body_nodes = [h.make_node("Constant", [], ["t"], value=t)]
    nodes = [h.make_node("Constant", [], ["c"], value=h.make_tensor("cv", T.BOOL, [], [True]))]
    if where == "Constant value":
        nodes.append(h.make_node("Constant", [], ["u"], value=t))
    elif where == "Constant tensors":  # a tensor list attribute, as a custom op may have
        nodes.append(h.make_node("Custom", [], ["u"], domain="x", tables=[inline, t]))
    body = h.make_graph(body_nodes, "then", [], [h.make_tensor_value_info("t", T.FLOAT, [2, 3])], body_inits)
    if where == "nested subgraph":
        body = h.make_graph([h.make_node("If", ["c"], ["t"], then_branch=body, else_branch=body)], "outer", [],
                            [h.make_tensor_value_info("t", T.FLOAT, [2, 3])])
    nodes.append(h.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body))
    m = make_model(nodes=nodes, inits=inits, inputs=[h.make_tensor_value_info("x", T.FLOAT, [2, 3])])
    m.graph.sparse_initializer.extend(sparse)
    if where == "none, its bytes in data":
        nodes.insert(0, h.make_node("Constant", [], ["v"], value=t))  # (in a node too: the scan finds the bytes)
        m = make_model(nodes=nodes, inits=inits, inputs=[h.make_tensor_value_info("x", T.FLOAT, [2, 3])])
        assert b"\x70\x01" in m.graph.node[0].SerializeToString()
    walked = any(modelfile.uses_external(t) for t, _, _ in modelfile.iter_tensors(m))
    assert walked == (not where.startswith("none"))
    assert modelfile.any_external(m.graph) == walked


@pytest.mark.parametrize("path", sorted(p for p in __import__("glob").glob(
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models", "**", "*.onnx"),
    recursive=True)), ids=os.path.basename)
def test_one_walk_finds_the_graphs_and_tensors_of_two(path):
    """The load's one pass over graphs and tensors (`iter_tensors` of a model) yields the tensors and
    labels, in the same order, of the two passes (`iter_graphs`, then each graph's tensors)."""
    model = onnx.load(path, load_external_data=False)
    graphs = list(modelfile.iter_graphs(model.graph))
    one = [label for _, label, _ in modelfile.iter_tensors(model)]
    two = [label for _, label, _ in modelfile.iter_tensors(model, graphs)]
    assert one == two


def test_one_walk_labels_constants_and_subgraph_tensors():
    """A Constant in an If branch: the same tensor labels through the one pass as through two."""
    const = h.make_node("Constant", [], ["c"], name="k", value=numpy_helper.from_array(np.ones(3, np.float32)))
    branch = h.make_graph([const, h.make_node("Identity", ["c"], ["b"])], "then", [],
                          [h.make_tensor_value_info("b", T.FLOAT, [3])])
    node = h.make_node("If", ["cond"], ["y"], name="if", then_branch=branch, else_branch=branch)
    model = make_model([node], inits=[numpy_helper.from_array(np.array(True), "cond")],
                       inputs=[h.make_tensor_value_info("x", T.FLOAT, [3])],
                       outputs=[h.make_tensor_value_info("y", T.FLOAT, [3])])
    labels = [label for _, label, _ in modelfile.iter_tensors(model)]
    assert labels == [label for _, label, _ in modelfile.iter_tensors(model, list(modelfile.iter_graphs(model.graph)))]
    assert any("attribute 'value' of node 'k' (Constant) (in subgraph 'then_branch'" in x for x in labels)


def test_save_given_the_checked_bytes_writes_what_it_would_serialize(tmp_path):
    model = make_model()
    save_model(model, tmp_path / "a.onnx")
    save_model(model, tmp_path / "b.onnx", serialized=saving.check_for_save(model))
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
