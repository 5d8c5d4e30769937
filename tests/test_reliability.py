"""Issue 7: bad input gets a clear error, nothing is lost, nothing escapes.

- A corpus of bad models goes through every command that takes a model (optimize, run, validate,
  inspect), in-process through `cli.main` and, for a few, as a real `python -m dmlgraph` process.
  Each gives exit 2, one `dmlgraph: error:` line naming the problem (optionally followed by a
  `  hint:` line), and never a traceback.
- Nothing is lost: the input model's folder is byte-identical after every command; writes are
  atomic (a failure injected mid-write leaves no partial output, no temp file, and an existing
  output untouched); `-o` equal to the input (any spelling, a symlink) is refused without --in-place.
- Resource limits: generated inputs are refused before allocation above the documented limit.
- Determinism and idempotence of optimize on the bundled models.
- A seeded fuzz of mutated models through optimize and inspect: exit 0 or 2, never 3, never a hang.
"""
from __future__ import annotations

import collections
import glob
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time

import fuzz_models
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from dmlgraph import pipeline
from dmlgraph.io import saving
from dmlgraph.tools import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAUSAL = os.path.join(ROOT, "models", "synthetic", "causal_attention.onnx")
PY = sys.executable


# ---- helpers -------------------------------------------------------------------------------------
def vi(name, shape, t=T.FLOAT):
    return h.make_tensor_value_info(name, t, shape)


def model(nodes, inputs, outputs, inits=(), opset=18, opsets=None):
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    ops = opsets or [h.make_opsetid("", opset)]
    return h.make_model(g, opset_imports=ops, ir_version=10)


def save(m, path) -> str:
    with open(path, "wb") as f:
        f.write(m.SerializeToString())
    return str(path)


def tree_digest(folder) -> dict[str, str]:
    """sha256 of every file under `folder` (symlinks by target name): a snapshot to compare."""
    out = {}
    for dirpath, _, files in os.walk(folder):
        for fn in files:
            p = os.path.join(dirpath, fn)
            if os.path.islink(p):
                out[p] = "link:" + os.readlink(p)
            else:
                with open(p, "rb") as f:
                    out[p] = hashlib.sha256(f.read()).hexdigest()
    return out


def run_cli(argv, capsys):
    code = cli.main([str(a) for a in argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def assert_clean_error(code, out, err, *words, exit_code=2):
    """Exit `exit_code`, one `dmlgraph: error:` line (plus optional hint lines), no traceback."""
    assert code == exit_code, f"exit {code}, expected {exit_code}\nstdout: {out}\nstderr: {err}"
    assert "Traceback" not in out + err
    lines = err.rstrip("\n").splitlines()
    assert lines and lines[0].startswith("dmlgraph: error: "), err
    assert all(line.startswith("  hint: ") for line in lines[1:]), f"extra stderr lines:\n{err}"
    for w in words:
        assert w.lower() in lines[0].lower(), f"{w!r} not in {lines[0]!r}"


def assert_ok(code, out, err):
    assert code == 0, f"exit {code}\nstdout: {out}\nstderr: {err}"
    assert "Traceback" not in out + err


# ---- the bad-model corpus ------------------------------------------------------------------------
# Each case: name -> (builder(folder) -> model path, words the error must contain). Every command
# that takes a model must refuse it with exit 2.
def _absurd_shape(folder):
    """An initializer claiming 2^42 elements (with 4 bytes of data): refused before numpy sees it."""
    w = T()
    w.name, w.data_type, w.raw_data = "w", T.FLOAT, b"\0\0\0\0"
    w.dims.extend([2**21, 2**21])
    return _relu(folder, [h.make_node("Add", ["x", "w"], ["y"])], inits=[w])


def _external(folder, location, write_file=True, offset="0", length="24"):
    if write_file:
        with open(os.path.join(folder, "w.bin"), "wb") as f:
            f.write(np.arange(6, dtype=np.float32).tobytes())
    t = T()
    t.name, t.data_type, t.data_location = "w", T.FLOAT, T.EXTERNAL
    t.dims.extend([2, 3])
    for k, v in (("location", location), ("offset", offset), ("length", length)):
        e = t.external_data.add()
        e.key, e.value = k, v
    m = model([h.make_node("Add", ["x", "w"], ["y"])], [vi("x", [2, 3])], [vi("y", [2, 3])], [t])
    return save(m, os.path.join(folder, "m.onnx"))


def _symlink_out(folder):
    outside = os.path.join(os.path.dirname(folder), os.path.basename(folder) + "_secret.bin")
    with open(outside, "wb") as f:
        f.write(np.arange(6, dtype=np.float32).tobytes())
    os.symlink(outside, os.path.join(folder, "link.bin"))
    return _external(folder, "link.bin", write_file=False)


def _relu(folder, nodes, inputs=None, outputs=None, inits=(), **kw):
    m = model(nodes, inputs or [vi("x", [2, 3])], outputs or [vi("y", [2, 3])], inits, **kw)
    return save(m, os.path.join(folder, "m.onnx"))


def _short_initializer(folder):
    w = numpy_helper.from_array(np.zeros((2, 3), np.float32), "w")
    w.raw_data = w.raw_data[:12]
    return _relu(folder, [h.make_node("Add", ["x", "w"], ["y"])], inits=[w])


def _negative_dim(folder):
    w = T()
    w.name, w.data_type = "w", T.FLOAT
    w.dims.extend([-1, 3])
    return _relu(folder, [h.make_node("Add", ["x", "w"], ["y"])], inits=[w])


def _random_bytes(folder):
    p = os.path.join(folder, "m.onnx")
    with open(p, "wb") as f:
        f.write(random.Random(7).randbytes(4096))
    return p


def _truncated(folder):
    with open(CAUSAL, "rb") as f:
        data = f.read()
    p = os.path.join(folder, "m.onnx")
    with open(p, "wb") as f:
        f.write(data[:len(data) // 2 + 1])
    return p


def _empty(folder):
    p = os.path.join(folder, "m.onnx")
    open(p, "wb").close()
    return p


def _non_utf8_dim_param(folder):
    """A dim_param that is not valid UTF-8 (protobuf parses it and hands back bytes; found by the fuzz)."""
    m = model([h.make_node("Relu", ["x"], ["y"])], [vi("x", ["QQQQ", 3])], [vi("y", ["QQQQ", 3])])
    p = os.path.join(folder, "m.onnx")
    with open(p, "wb") as f:
        f.write(m.SerializeToString().replace(b"QQQQ", b"\xdb\xdbQQ"))
    return p


def _undefined_elem_type(folder):
    """An input whose elem_type is -1: the checker lets it through (found by the fuzz)."""
    m = model([h.make_node("Trilu", ["x"], ["y"])], [vi("x", [4, 4])], [vi("y", [4, 4])])
    m.graph.input[0].type.tensor_type.elem_type = -1
    return save(m, os.path.join(folder, "m.onnx"))


def _control_chars_in_name(folder):
    """A graph output whose name holds a newline: the message must stay one line (found by the fuzz)."""
    return _relu(folder, [h.make_node("Relu", ["x"], ["y"])], outputs=[vi("y\nTraceback", [2, 3])])


BAD_MODELS = {
    "missing": (lambda d: os.path.join(d, "nope.onnx"), ["not found", "nope.onnx"]),
    "empty": (_empty, ["empty"]),
    "random_bytes": (_random_bytes, ["not a valid ONNX model"]),
    "truncated": (_truncated, ["not a valid ONNX model"]),
    "directory": (lambda d: d, ["directory"]),
    "checker_fails": (lambda d: _relu(d, [h.make_node("Add", ["x"], ["y"])]), ["ONNX checker"]),
    "cycle": (lambda d: _relu(d, [h.make_node("Add", ["x", "b"], ["a"], name="A"),
                                 h.make_node("Relu", ["a"], ["b"], name="B"),
                                 h.make_node("Identity", ["b"], ["y"])]), ["cycle"]),
    "dangling_input": (lambda d: _relu(d, [h.make_node("Add", ["x", "ghost"], ["y"])]), ["dangling", "ghost"]),
    "unknown_op_default_domain": (lambda d: _relu(d, [h.make_node("Foo", ["x"], ["y"])]), ["Foo"]),
    "unknown_domain_no_opset": (lambda d: _relu(d, [h.make_node("Foo", ["x"], ["y"], domain="com.example")]),
                                ["com.example"]),
    "unknown_opset_version": (lambda d: _relu(d, [h.make_node("Relu", ["x"], ["y"])], opset=999), ["opset 999"]),
    "short_initializer": (_short_initializer, ["raw_data", "shorter"]),
    "external_absolute": (lambda d: _external(d, "/etc/passwd"), ["absolute"]),
    "external_dotdot": (lambda d: _external(d, "../w.bin"), [".."]),
    "external_symlink_out": (_symlink_out, ["outside"]),
    "external_missing": (lambda d: _external(d, "gone.bin"), ["missing", "gone.bin"]),
    "negative_initializer_dim": (_negative_dim, ["negative"]),
    "non_utf8_dim_param": (_non_utf8_dim_param, ["UTF-8"]),
    "absurd_initializer_shape": (_absurd_shape, ["absurd shape"]),
    "external_past_end_of_file": (lambda d: _external(d, "w.bin", length="24", offset="16"), ["runs past the end"]),
    "external_length_mismatch": (lambda d: _external(d, "w.bin", length="4096"), ["does not match"]),
    "undefined_elem_type": (_undefined_elem_type, ["element type -1"]),
    "control_chars_in_name": (_control_chars_in_name, ["y\\nTraceback", "not produced"]),
}


def _commands(path, folder):
    out = os.path.join(folder, "out.onnx")
    return {"optimize": ["optimize", path, "-o", out], "run": ["run", path],
            "validate": ["validate", path], "inspect": ["inspect", path]}


@pytest.mark.parametrize("command", ["optimize", "run", "validate", "inspect"])
@pytest.mark.parametrize("case", sorted(BAD_MODELS))
def test_bad_model_corpus(case, command, tmp_path, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    build, words = BAD_MODELS[case]
    path = build(str(folder))
    before = tree_digest(tmp_path)
    code, out, err = run_cli(_commands(path, str(folder))[command], capsys)
    if case == "control_chars_in_name":
        err = err.replace("y\\nTraceback", "y\\n")  # the escaped name itself is fine
    assert_clean_error(code, out, err, *[w.replace("y\\nTraceback", "y\\n") for w in words])
    assert tree_digest(tmp_path) == before, "a failed command changed or left files"


@pytest.mark.parametrize("case,command", [("truncated", "optimize"), ("cycle", "run"),
                                          ("external_dotdot", "validate"), ("random_bytes", "inspect")])
def test_bad_model_subprocess(case, command, tmp_path):
    """The real interpreter: exit 2, one error line on stderr, no traceback, no crash (signal)."""
    folder = tmp_path / "in"
    folder.mkdir()
    build, words = BAD_MODELS[case]
    path = build(str(folder))
    proc = subprocess.run([PY, "-m", "dmlgraph", *_commands(path, str(folder))[command]],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert_clean_error(proc.returncode, proc.stdout, proc.stderr, *words)


# ---- models that are valid but unusual: clear outcomes per command -------------------------------
def _custom_op_model(folder):
    """A node in an unknown custom domain (declared in opset_import): the checker allows it."""
    m = model([h.make_node("Relu", ["x"], ["a"]), h.make_node("Foo", ["a"], ["b"], domain="com.example"),
               h.make_node("Trilu", ["b"], ["y"], upper=0)], [vi("x", [4, 4])], [vi("y", [4, 4])],
              opsets=[h.make_opsetid("", 18), h.make_opsetid("com.example", 1)])
    return save(m, os.path.join(folder, "custom.onnx"))


def test_unknown_custom_op_passes_through_optimize(tmp_path, capsys):
    path = _custom_op_model(str(tmp_path))
    out = tmp_path / "out.onnx"
    code, o, e = run_cli(["optimize", path, "-o", out, "--target", "onnx"], capsys)
    assert_ok(code, o, e)
    written = onnx.load(str(out))
    onnx.checker.check_model(written)
    assert [(n.domain, n.op_type) for n in written.graph.node if n.domain] == [("com.example", "Foo")]
    code, o, e = run_cli(["inspect", path], capsys)
    assert_ok(code, o, e)


@pytest.mark.parametrize("command", ["run", "validate"])
def test_unknown_custom_op_cannot_run(command, tmp_path, capsys):
    path = _custom_op_model(str(tmp_path))
    code, o, e = run_cli([command, path], capsys)
    assert_clean_error(code, o, e, "Foo")


def test_trilu_zero_size_is_declined_not_crashed(tmp_path, capsys):
    path = save(model([h.make_node("Trilu", ["x"], ["y"])], [vi("x", [0, 5])], [vi("y", [0, 5])]),
                tmp_path / "z.onnx")
    code, o, e = run_cli(["optimize", path, "-o", tmp_path / "out.onnx", "--json"], capsys)
    assert_ok(code, o, e)
    assert "zero-size" in o
    for command in (["run", path], ["validate", path], ["inspect", path]):
        code, o, e = run_cli(command, capsys)
        assert_ok(code, o, e)


def test_trilu_float_k_is_a_type_error(tmp_path, capsys):
    """onnxruntime refuses a float k: the model is wrong, every command says so (exit 2)."""
    path = save(model([h.make_node("Trilu", ["x", "k"], ["y"])], [vi("x", [4, 4])], [vi("y", [4, 4])],
                      [numpy_helper.from_array(np.array(1.0, np.float32), "k")]), tmp_path / "k.onnx")
    for command in (["optimize", path, "-o", tmp_path / "out.onnx"], ["inspect", path], ["run", path],
                    ["validate", path]):
        code, o, e = run_cli(command, capsys)
        assert_clean_error(code, o, e, "type error", "Trilu", "tensor(float)")
    assert not (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize("k", [np.array([1, 2], np.int64)], ids=["int64x2"])
def test_trilu_bad_k_declined_and_run_refused(k, tmp_path, capsys):
    path = save(model([h.make_node("Trilu", ["x", "k"], ["y"])], [vi("x", [4, 4])], [vi("y", [4, 4])],
                      [numpy_helper.from_array(k, "k")]), tmp_path / "k.onnx")
    code, o, e = run_cli(["optimize", path, "-o", tmp_path / "out.onnx", "--json"], capsys)
    assert_ok(code, o, e)
    assert "k is not an integer scalar" in o
    code, o, e = run_cli(["inspect", path], capsys)
    assert_ok(code, o, e)
    for command in ("run", "validate"):
        code, o, e = run_cli([command, path], capsys)
        assert_clean_error(code, o, e, "onnxruntime")


def test_eyelike_invalid_dtype_is_declined(tmp_path, capsys):
    """EyeLike(dtype=2^40) passes the loader's checker but not the full check every written model
    must pass: optimize refuses it (exit 2, the input's fault), inspect declines it, run refuses it."""
    path = save(model([h.make_node("EyeLike", ["x"], ["y"], dtype=2**40)], [vi("x", [4, 4])], [vi("y", [4, 4])]),
                tmp_path / "e.onnx")
    code, o, e = run_cli(["optimize", path, "-o", tmp_path / "out.onnx", "--json"], capsys)
    assert_clean_error(code, o, e, "full check", "Invalid tensor data type")
    assert not (tmp_path / "out.onnx").exists()
    code, o, e = run_cli(["inspect", path, "--json"], capsys)
    assert_ok(code, o, e)
    assert "not an ONNX tensor type" in o
    code, o, e = run_cli(["inspect", path], capsys)
    assert_ok(code, o, e)
    code, o, e = run_cli(["run", path], capsys)
    assert_clean_error(code, o, e, "onnxruntime")


# ---- resource limits -----------------------------------------------------------------------------
def _range_mask(static_side):
    """The exporters' Range/LessOrEqual causal mask, read from dim 2 of x = [1, 2, side, s]."""
    c = lambda n, a: numpy_helper.from_array(np.asarray(a), n)
    return model([
        h.make_node("Shape", ["x"], ["s"]), h.make_node("Gather", ["s", "i2"], ["n"], axis=0),
        h.make_node("Range", ["zero", "n", "one"], ["r"]), h.make_node("Unsqueeze", ["r", "ax0"], ["row"]),
        h.make_node("Unsqueeze", ["r", "ax1"], ["col"]), h.make_node("LessOrEqual", ["row", "col"], ["keep"]),
        h.make_node("Where", ["keep", "x", "ninf"], ["y"])],
        [vi("x", [1, 2, static_side, "s"])], [vi("y", [1, 2, "s", "s"])],
        [c("i2", np.int64(2)), c("zero", np.int64(0)), c("one", np.int64(1)), c("ax0", np.array([0], np.int64)),
         c("ax1", np.array([1], np.int64)), c("ninf", np.float32(-np.inf))])


def test_mask_too_large_for_directml_is_declined_fast(tmp_path, capsys):
    """A 70000 dim feeding a mask subgraph made optimize evaluate a 70000^2 mask (found by the fuzz);
    the symbolic proof never materializes it, and DirectML's element limit declines it."""
    path = save(_range_mask(70000), tmp_path / "m.onnx")
    t0 = time.perf_counter()
    code, o, e = run_cli(["optimize", path, "-o", tmp_path / "out.onnx", "--json"], capsys)
    assert_ok(code, o, e)
    assert "4900000000 elements" in o
    assert time.perf_counter() - t0 < 60  # a hang guard, not a speed test (the bench measures speed)


@pytest.mark.parametrize("kind", ["range_1e9", "declared_2^62", "declared_float_2^40"])
def test_shape_inference_data_propagation_cannot_hang(kind, tmp_path, capsys):
    """onnx's data propagation is linear in a 1-D value's length, whatever its type: Range(0, 10^9)
    -> Cast, or a shape vector declared [2^62] (both found by the fuzz), or a float vector declared
    [2^40], never returned; such models skip it."""
    c = lambda n, a: numpy_helper.from_array(np.asarray(a), n)
    if kind == "range_1e9":
        m = model([h.make_node("Range", ["z", "n", "o"], ["r"]), h.make_node("Cast", ["r"], ["c"], to=T.FLOAT),
                   h.make_node("Add", ["x", "c"], ["y"])], [vi("x", [1])], [vi("y", ["m"])],
                  [c("z", np.int64(0)), c("n", np.int64(10**9)), c("o", np.int64(1))])
    elif kind == "declared_2^62":
        m = model([h.make_node("Shape", ["x"], ["s"]), h.make_node("Unsqueeze", ["s", "ax"], ["u"]),
                   h.make_node("Cast", ["u"], ["y"], to=T.FLOAT)], [vi("x", ["a", "b"])], [vi("y", [1, "k"])],
                  [c("ax", np.array([0], np.int64))])
        m.graph.value_info.append(vi("s", [2**62], T.INT64))
    else:
        m = model([h.make_node("Identity", ["x"], ["s"]), h.make_node("Cast", ["s"], ["y"], to=T.DOUBLE)],
                  [vi("x", ["k"])], [vi("y", ["k"], T.DOUBLE)], [])
        m.graph.value_info.append(vi("s", [2**40]))
    path = save(m, tmp_path / "m.onnx")
    t0 = time.perf_counter()
    for argv in (["optimize", path, "-o", tmp_path / "out.onnx"], ["inspect", path]):
        code, o, e = run_cli(argv, capsys)
        assert_ok(code, o, e)
    if kind == "declared_2^62":  # it contradicts Shape's [2]: dropped (issue 28), not written out
        declared = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
                    for v in onnx.load(str(tmp_path / "out.onnx")).graph.value_info}
        assert declared.get("s", [2]) == [2]
    assert time.perf_counter() - t0 < 60  # a hang guard, not a speed test (the bench measures speed)



@pytest.mark.parametrize("shape,words", [([70000, 70000], ["4900000000 elements"]),
                                         ([2**40, 4], ["elements"]),
                                         (["n", 1024, 1024], ["GiB"])], ids=["70k^2", "2^40", "dim"])
def test_generated_inputs_refused_before_allocation(shape, words, tmp_path, capsys):
    path = save(model([h.make_node("Trilu", ["x"], ["y"])], [vi("x", shape)], [vi("y", shape)]),
                tmp_path / "big.onnx")
    dim = ["--dim", "n=512"] if "n" in shape else []  # (a name the model lacks is refused)
    for command in ("run", "validate"):
        t0 = time.perf_counter()
        code, o, e = run_cli([command, path, *dim], capsys)
        assert_clean_error(code, o, e, *words)
        assert "--dim" in e and "--inputs" in e
        assert time.perf_counter() - t0 < 60  # a hang guard, not a speed test (the bench measures speed)
    code, o, e = run_cli(["optimize", path, "-o", tmp_path / "out.onnx"], capsys)
    assert_ok(code, o, e)  # a desc over the DML limit is declined, nothing is allocated


def test_generated_inputs_size_a_summed_dim_from_its_terms(capsys):
    """torch names a KV-cache model's attention_mask length "past_sequence + sequence": generated
    inputs make it the sum, so `validate MODEL` without inputs runs (it failed in onnxruntime's
    Gather with every dim 4: 1 of 21 KV exports validated so)."""
    kv = os.path.join(ROOT, "models", "llama_kv_ts.onnx")
    _, g = pipeline.load(kv)
    feeds = pipeline.make_inputs(g, {"past_sequence": 7, "sequence": 1})
    assert feeds["attention_mask"].shape == (4, 8) and feeds["past_key_values.0.key"].shape == (4, 1, 7, 16)
    assert pipeline.make_inputs(g, {"past_sequence + sequence": 3})["attention_mask"].shape == (4, 3)
    code, o, e = run_cli(["validate", kv], capsys)
    assert_ok(code, o, e)
    assert "attention_mask[4, 8]" in o and "PASS" in o


@pytest.mark.parametrize("command", ["run", "validate", "dxdispatch"])
def test_a_run_refusing_generated_inputs_says_they_were_generated(command, tmp_path, capsys):
    """onnxruntime refusing made-up inputs (here a symbolic n the model needs to be 3) gets a hint
    naming the model's dims and --dim / --inputs; real inputs get no such hint."""
    path = save(model([h.make_node("Trilu", ["x"], ["t"]), h.make_node("Add", ["t", "b"], ["y"])],
                      [vi("x", ["n", "n"]), vi("b", [3])], [vi("y", ["n", 3])]), tmp_path / "m.onnx")
    extra = ["-o", tmp_path / "dx"] if command == "dxdispatch" else []
    code, o, e = run_cli([command, path, *extra], capsys)
    assert_clean_error(code, o, e, "onnxruntime failed")
    assert "hint: the inputs were generated" in e and "(n)" in e and "--dim NAME=SIZE" in e
    assert_ok(*run_cli([command, path, "--dim", "n=3", *extra], capsys))
    np.savez(tmp_path / "in.npz", x=np.zeros((4, 4), np.float32), b=np.zeros(3, np.float32))
    code, o, e = run_cli(["run", path, "--inputs", tmp_path / "in.npz"], capsys)
    assert code == 2 and "generated" not in e


def test_make_inputs_limit_is_documented_and_overridable():
    _, g = pipeline.load(CAUSAL)
    with pytest.raises(pipeline.DmlgraphError, match="GiB"):
        pipeline.make_inputs(g, {"seq": 2**20, "batch": 64})
    feeds = pipeline.make_inputs(g, {"seq": 8, "batch": 1}, max_bytes=4096)
    assert feeds["q"].shape == (1, 2, 8, 8)
    with pytest.raises(pipeline.DmlgraphError):
        pipeline.make_inputs(g, {"seq": 64, "batch": 1}, max_bytes=4096)


def test_negative_declared_dim_refused(tmp_path, capsys):
    m = model([h.make_node("Relu", ["x"], ["y"])], [vi("x", [2, 3])], [vi("y", [2, 3])])
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -3
    path = save(m, tmp_path / "neg.onnx")
    code, o, e = run_cli(["run", path], capsys)
    assert code == 2 and "Traceback" not in o + e, e


# ---- bad CLI values ------------------------------------------------------------------------------
@pytest.mark.parametrize("argv,words", [
    (["optimize", CAUSAL, "-o", "{tmp}/o.onnx", "--feature-level", "9_9"], ["feature level"]),
    (["validate", CAUSAL, "--feature-level", "banana"], ["feature level"]),
    (["inspect", CAUSAL, "--feature-level", "9_9"], ["feature level"]),
    (["run", CAUSAL, "--dim", "bad"], ["NAME=SIZE"]),
    (["validate", CAUSAL, "--dim", "seq=-1"], ["NAME=SIZE"]),
    (["run", CAUSAL, "--inputs", "{tmp}/missing.npz"], ["missing.npz"]),
    (["run", CAUSAL, "--inputs", CAUSAL], ["cannot read inputs"]),
    (["run", CAUSAL, "--seed", "-1"], ["--seed"]),
    (["run", CAUSAL, "--seed", "abc"], ["--seed"]),
    (["run", CAUSAL, "--threads", "0"], ["--threads"]),
    (["validate", CAUSAL, "--threads", "0"], ["--threads"]),
    (["optimize", CAUSAL], ["--output"]),
    (["optimize", CAUSAL, "-o", "{tmp}/o.onnx", "--target", "tpu"], ["--target"]),
    (["frobnicate"], ["frobnicate"]),
    (["optimize", CAUSAL, "-o", "{tmp}/no/such/dir/o.onnx"], ["does not exist"]),
    (["optimize", CAUSAL, "-o", "{tmp}"], ["directory"]),
    (["run", CAUSAL, "-o", "{tmp}/no/such/dir/o.npz"], ["does not exist"]),
    (["run", CAUSAL, "-o", "{tmp}"], ["directory"]),
    (["run", CAUSAL, "-o", CAUSAL], ["input model"]),
    (["inspect", CAUSAL, "--dot", CAUSAL], ["input model", "--dot"]),
    (["inspect", CAUSAL, "--svg", CAUSAL], ["input model", "--svg"]),
], ids=lambda x: "_".join(x)[:60] if isinstance(x, list) else None)
def test_bad_cli_values(argv, words, tmp_path, capsys):
    before = tree_digest(os.path.dirname(CAUSAL))
    code, o, e = run_cli([a.replace("{tmp}", str(tmp_path)) for a in argv], capsys)
    assert_clean_error(code, o, e, *words)
    assert os.listdir(tmp_path) == []
    assert tree_digest(os.path.dirname(CAUSAL)) == before


@pytest.mark.parametrize("argv", [
    ["optimize", "{tmp}/missing.onnx", "-o", "{tmp}/o.onnx"], ["run", "{tmp}/missing.onnx"],
    ["validate", "{tmp}/missing.onnx"], ["inspect", "{tmp}/missing.onnx"],
    ["dxdispatch", "{tmp}/missing.onnx", "-o", "{tmp}/dx"], ["dxdispatch", "--check", "{tmp}"],
], ids=lambda a: "_".join(a[:2]).replace("{tmp}/", ""))
def test_json_failures_print_an_error_document(argv, tmp_path, capsys):
    """With --json a failure still prints a document on stdout (a script reads stdout), besides the
    error line on stderr: {"error": {"message", "hint", "exit_code"}}."""
    code, o, e = run_cli([a.replace("{tmp}", str(tmp_path)) for a in argv] + ["--json"], capsys)
    assert_clean_error(code, "", e)
    doc = json.loads(o)
    assert list(doc) == ["error"] and sorted(doc["error"]) == ["exit_code", "hint", "message"]
    assert doc["error"]["exit_code"] == code == 2
    assert doc["error"]["message"] in e.splitlines()[0]


def _npz(tmp_path, **arrays):
    p = tmp_path / "in.npz"
    np.savez(p, **arrays)
    return str(p)


@pytest.mark.parametrize("command", ["run", "validate"])
@pytest.mark.parametrize("arrays,words", [
    ({"q": np.zeros((1, 2, 4, 8), np.float32), "k": np.zeros((1, 2, 4, 8), np.float32),
      "v": np.zeros((1, 2, 4, 8), np.float32), "extra": np.zeros(1)}, ["extra"]),
    ({"q": np.zeros((1, 2, 4, 8), np.float32), "k": np.zeros((1, 2, 4, 8), np.float32)}, ["missing", "v"]),
    ({"q": np.zeros((1, 2, 4, 8), np.float64), "k": np.zeros((1, 2, 4, 8), np.float32),
      "v": np.zeros((1, 2, 4, 8), np.float32)}, ["'q'", "float64", "float32"]),
    ({"q": np.zeros((1, 2, 4, 7), np.float32), "k": np.zeros((1, 2, 4, 8), np.float32),
      "v": np.zeros((1, 2, 4, 8), np.float32)}, ["'q'", "shape"]),
    ({"q": np.zeros((2, 4, 8), np.float32), "k": np.zeros((1, 2, 4, 8), np.float32),
      "v": np.zeros((1, 2, 4, 8), np.float32)}, ["'q'", "rank"]),
    # (dims sharing a name are a claim, not refused up front: here onnxruntime refuses the run itself,
    # at the first node that broadcasts the two lengths: `run`'s Add, or `validate`'s mask Where,
    # which runs first when the original runs in the lowered model's sessions)
    ({"q": np.zeros((1, 2, 4, 8), np.float32), "k": np.zeros((1, 2, 5, 8), np.float32),
      "v": np.zeros((1, 2, 4, 8), np.float32)}, ["onnxruntime failed", "broadcast"]),
], ids=["extra_name", "missing_name", "dtype", "static_dim", "rank", "symbolic_dim_conflict"])
def test_bad_npz_inputs(command, arrays, words, tmp_path, capsys):
    code, o, e = run_cli([command, CAUSAL, "--inputs", _npz(tmp_path, **arrays)], capsys)
    assert_clean_error(code, o, e, *words)


def test_an_inputs_file_that_is_not_an_npz_says_what_it_is(tmp_path, capsys):
    """numpy.load calls any non-zip file "pickled (object) data", and a .npy failed on a context
    manager: the error says what the file is and how to write an .npz."""
    np.save(tmp_path / "one.npy", np.zeros(3, np.float32))
    (tmp_path / "text.npz").write_text("q,k,v\n")
    for name, words in (("one.npy", ["single array", ".npy"]), ("text.npz", ["not an .npz"])):
        code, o, e = run_cli(["run", CAUSAL, "--inputs", tmp_path / name], capsys)
        assert_clean_error(code, o, e, "cannot read inputs", *words)
        assert "pickled" not in e and "numpy.savez" in e


def test_good_npz_inputs_run(tmp_path, capsys):
    arrays = {n: np.ones((1, 2, 4, 8), np.float32) for n in "qkv"}
    code, o, e = run_cli(["run", CAUSAL, "--inputs", _npz(tmp_path, **arrays)], capsys)
    assert_ok(code, o, e)


def test_validate_takes_a_thread_count(capsys):
    code, o, e = run_cli(["validate", CAUSAL, "--dim", "seq=5", "--threads", "1"], capsys)
    assert_ok(code, o, e)
    assert "PASS" in o


@pytest.mark.parametrize("target", ["dml", "onnx"])
def test_validate_checks_a_written_model(target, tmp_path, capsys):
    """`validate MODEL LOWERED` runs the file optimize wrote (not a lowering made in memory), with
    the rewrites its metadata records; a wrong file fails (exit 1), an unrelated one is exit 2."""
    out = tmp_path / "out.onnx"
    assert_ok(*run_cli(["optimize", CAUSAL, "-o", out, "--target", target], capsys))
    code, o, e = run_cli(["validate", CAUSAL, out, "--dim", "seq=5", "--json"], capsys)
    assert_ok(code, o, e)
    report = json.loads(o)
    assert report["ok"] and report["rewrites"] == {"mask_subgraph": 2, "mask_where": 1}
    wrong = onnx.load(str(out))
    name = wrong.graph.output[0].name  # the output negated: Neg(producer's value)
    producer = next(n for n in wrong.graph.node if name in n.output)
    producer.output[list(producer.output).index(name)] = name + "_pre"
    wrong.graph.node.append(h.make_node("Neg", [name + "_pre"], [name]))
    save(wrong, tmp_path / "wrong.onnx")
    code, o, e = run_cli(["validate", CAUSAL, tmp_path / "wrong.onnx", "--dim", "seq=5"], capsys)
    assert code == 1 and "FAIL" in o
    other = os.path.join(ROOT, "models", "eye_static8_ts.onnx")
    assert_clean_error(*run_cli(["validate", CAUSAL, other], capsys), "no output")
    for flag in (["--exact"], ["--feature-level", "4_0"]):  # (they would be ignored: refused)
        assert_clean_error(*run_cli(["validate", CAUSAL, out, *flag], capsys), "as it was written")


def test_every_option_says_its_default_and_the_exit_codes_are_listed():
    """--help of each command: every option that has a default says it; every command has a
    description; the top-level help lists every exit code the README documents."""
    import argparse
    parser = cli.build_parser()
    top = parser.format_help()
    for code in ("0 ok", "1 validate", "2 bad input", "3 internal", "130 interrupted", "141"):
        assert code in " ".join(top.split()), code
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name, sp in commands.items():
        assert sp.description, f"{name} has no description"
        for action in sp._actions:
            if action.help in (None, argparse.SUPPRESS) or action.default in (None, False, argparse.SUPPRESS):
                continue
            assert "default" in action.help, f"{name} {action.option_strings}: no default in {action.help!r}"


def test_optimize_on_a_terminal_shows_the_write_as_progress(tmp_path, capsys, monkeypatch):
    """On a terminal, progress covers the write too (7 of 10 s of a model with 2 GiB of weights,
    which printed nothing); piped or with --json there is none."""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    code, o, e = run_cli(["optimize", CAUSAL, "-o", tmp_path / "o.onnx"], capsys)
    assert code == 0 and f".. writing {tmp_path / 'o.onnx'} (" in e
    code, o, e = run_cli(["optimize", CAUSAL, "-o", tmp_path / "o.onnx", "--json"], capsys)
    assert code == 0 and e == ""


def test_optimize_with_nothing_lowered_says_where_to_look(tmp_path, capsys):
    """A model with nothing to lower: the summary points to inspect, which says why."""
    path = save(model([h.make_node("Relu", ["x"], ["y"])], [vi("x", ["n"])], [vi("y", ["n"])]), tmp_path / "m.onnx")
    code, o, e = run_cli(["optimize", path, "-o", tmp_path / "o.onnx"], capsys)
    assert_ok(code, o, e)
    assert f"rewrites: none (`dmlgraph inspect {path}` lists what was found" in o


def test_argparse_errors_in_a_real_process(tmp_path):
    proc = subprocess.run([PY, "-m", "dmlgraph", "run", CAUSAL, "--seed", "x"], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert_clean_error(proc.returncode, proc.stdout, proc.stderr, "--seed")


_BLAS_PROBE = """import os, sys
class FirstNumpyImport:  # says what OPENBLAS_NUM_THREADS is when numpy is first imported
    def find_spec(self, name, path=None, target=None):
        if name == "numpy":
            sys.meta_path.remove(self)
            print(os.environ.get("OPENBLAS_NUM_THREADS"), flush=True)
        return None
sys.meta_path.insert(0, FirstNumpyImport())
from dmlgraph.tools import cli
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("user", [None, "3"])
def test_optimize_sets_one_blas_thread_before_numpy(user, tmp_path):
    """OPENBLAS_NUM_THREADS is read at numpy's first import: optimize sets it before that, unless
    the user set it; other commands leave it alone."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"} | ({} if user is None else
                                                                                  {"OPENBLAS_NUM_THREADS": user})
    for argv, want in ((["optimize", CAUSAL, "-o", str(tmp_path / "o.onnx")], user or "1"),
                       (["inspect", CAUSAL], user)):
        proc = subprocess.run([PY, "-c", _BLAS_PROBE, *argv], capture_output=True, text=True, timeout=120,
                              cwd=ROOT, env=env)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.splitlines()[0] == f"{want}"


# ---- nothing is lost -----------------------------------------------------------------------------
def _copy_causal(folder) -> str:
    p = os.path.join(folder, "model.onnx")
    with open(CAUSAL, "rb") as src, open(p, "wb") as dst:
        dst.write(src.read())
    return p


def test_every_command_leaves_the_input_untouched(tmp_path, capsys):
    folder = tmp_path / "m"
    folder.mkdir()
    path = _copy_causal(str(folder))
    before = tree_digest(folder)
    for argv in (["optimize", path, "-o", tmp_path / "a.onnx"],
                 ["optimize", path, "-o", tmp_path / "b.onnx", "--target", "onnx"],
                 ["run", path, "-o", tmp_path / "r.npz"], ["validate", path], ["inspect", path],
                 ["inspect", path, "--json"], ["validate", path, "--exact"]):
        code, o, e = run_cli(argv, capsys)
        assert_ok(code, o, e)
        assert tree_digest(folder) == before, argv


def _fail_write(monkeypatch, after_bytes=10):
    """Make modelfile's write seam fail after `after_bytes` bytes reached the temp file."""
    real = saving.write_bytes

    def broken(f, data):
        real(f, data[:after_bytes])
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(saving, "write_bytes", broken)


@pytest.mark.parametrize("existing", [False, True], ids=["new_output", "existing_output"])
def test_optimize_failure_mid_write_leaves_nothing(existing, tmp_path, capsys, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    path = _copy_causal(str(src))
    out = tmp_path / "out"
    out.mkdir()
    target = out / "lowered.onnx"
    if existing:
        target.write_bytes(b"previous output")
    before_src, before_out = tree_digest(src), tree_digest(out)
    _fail_write(monkeypatch)
    code, o, e = run_cli(["optimize", path, "-o", target], capsys)
    assert_clean_error(code, o, e, "cannot write", "No space left")
    assert tree_digest(out) == before_out  # no partial file, no temp file, old output intact
    assert tree_digest(src) == before_src


def test_optimize_serialization_failure_leaves_nothing(tmp_path, capsys, monkeypatch):
    """onnx's serialization raising inside the save (e.g. protobuf's 2 GiB limit)."""
    path = _copy_causal(str(tmp_path))
    (tmp_path / "o.onnx").write_bytes(b"previous output")
    before = tree_digest(tmp_path)
    real_save = saving.save_model

    def save_with_broken_serializer(*a, **k):
        def boom(self, *args, **kwargs):
            raise ValueError("serialization exploded")
        with monkeypatch.context() as m:
            m.setattr(onnx.ModelProto, "SerializeToString", boom)
            return real_save(*a, **k)
    monkeypatch.setattr(saving, "save_model", save_with_broken_serializer)
    code, o, e = run_cli(["optimize", path, "-o", tmp_path / "o.onnx"], capsys)
    assert_clean_error(code, o, e, "cannot serialize", "serialization exploded")
    assert tree_digest(tmp_path) == before


def test_optimize_interrupted_mid_write_leaves_nothing(tmp_path, capsys, monkeypatch):
    path = _copy_causal(str(tmp_path))
    before = tree_digest(tmp_path)

    def interrupted(f, data):
        f.write(data[:5])
        raise KeyboardInterrupt
    monkeypatch.setattr(saving, "write_bytes", interrupted)
    code, o, e = run_cli(["optimize", path, "-o", tmp_path / "o.onnx"], capsys)
    assert code == 130 and "Traceback" not in o + e
    assert tree_digest(tmp_path) == before


def test_output_equal_to_input_refused_in_every_spelling(tmp_path, capsys):
    folder = tmp_path / "m"
    folder.mkdir()
    path = _copy_causal(str(folder))
    os.symlink(path, tmp_path / "alias.onnx")
    before = tree_digest(folder)
    spellings = [path, os.path.join(str(folder), ".", "model.onnx"),
                 os.path.join(str(folder), "..", "m", "model.onnx"), str(tmp_path / "alias.onnx")]
    for spelling in spellings:
        code, o, e = run_cli(["optimize", path, "-o", spelling], capsys)
        assert_clean_error(code, o, e, "refusing to overwrite the input")
        assert "--in-place" in e
    # relative spelling from the model's folder
    old = os.getcwd()
    os.chdir(folder)
    try:
        code, o, e = run_cli(["optimize", "model.onnx", "-o", "./model.onnx"], capsys)
        assert_clean_error(code, o, e, "refusing to overwrite the input")
    finally:
        os.chdir(old)
    assert tree_digest(folder) == before


def test_in_place_replaces_the_input(tmp_path, capsys):
    path = _copy_causal(str(tmp_path))
    with open(path, "rb") as f:
        original = f.read()
    code, o, e = run_cli(["optimize", path, "-o", path, "--in-place", "--json"], capsys)
    assert_ok(code, o, e)
    with open(path, "rb") as f:
        rewritten = f.read()
    assert rewritten != original
    onnx.checker.check_model(onnx.load(path))
    assert sorted(os.listdir(tmp_path)) == ["model.onnx"]
    import json
    report = json.loads(o)
    assert report["before"]["file_bytes"] == len(original)
    assert report["after"]["file_bytes"] == len(rewritten)


def test_run_output_is_atomic(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "o"
    folder.mkdir()
    (folder / "out.npz").write_bytes(b"previous")
    before = tree_digest(folder)

    def boom(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(np, "savez", boom)
    code, o, e = run_cli(["run", CAUSAL, "-o", folder / "out.npz"], capsys)
    assert_clean_error(code, o, e, "cannot write", "No space left")
    monkeypatch.undo()
    assert tree_digest(folder) == before


@pytest.mark.parametrize("name", ["out.npz", "out", "out.partial"])
def test_run_output_written_exactly_where_asked(name, tmp_path, capsys):
    code, o, e = run_cli(["run", CAUSAL, "-o", tmp_path / name], capsys)
    assert_ok(code, o, e)
    assert os.listdir(tmp_path) == [name]  # np.savez would append .npz to a bare name; we do not
    with np.load(tmp_path / name) as data:
        assert sorted(data.files) == ["attn", "scores_plus_eye"]


# ---- determinism and idempotence -----------------------------------------------------------------
def _models():
    found = sorted(glob.glob(os.path.join(ROOT, "models", "**", "*.onnx"), recursive=True))
    return [os.path.relpath(p, ROOT) for p in found]


# T5's relative-position bucket band is lowered in a later sweep of the first optimize and in the
# first sweep of the second: the same nodes, which export places where what they replaced was.
@pytest.mark.parametrize("target", ["dml", "onnx"])
@pytest.mark.parametrize("rel", _models())
def test_optimize_is_deterministic_and_idempotent(rel, target, tmp_path, capsys):
    import json
    path = os.path.join(ROOT, rel)
    outs = []
    for name in ("a.onnx", "b.onnx"):
        code, o, e = run_cli(["optimize", path, "-o", tmp_path / name, "--target", target], capsys)
        assert_ok(code, o, e)
        outs.append((tmp_path / name).read_bytes())
    assert outs[0] == outs[1], "same input and options gave different bytes"
    code, o, e = run_cli(["optimize", tmp_path / "a.onnx", "-o", tmp_path / "c.onnx", "--target", target,
                          "--json"], capsys)
    assert_ok(code, o, e)
    if target == "dml":
        assert sum(json.loads(o)["rewrites"].values()) == 0, "optimizing an optimized model rewrote it"
    # The portable target writes standard ops that the rules rightly find and lower again; the
    # rewrite reuses the size plumbing it finds and names what it makes after its output, so the
    # second round writes the same bytes.
    assert (tmp_path / "c.onnx").read_bytes() == outs[0], "optimizing an optimized model changed it"


# ---- fuzz ----------------------------------------------------------------------------------------
FUZZ_SEED = 20240607
FUZZ_CASES = 2000
FUZZ_FILE_SEEDS = ["models/synthetic/causal_attention.onnx", "models/eye_static8_ts.onnx",
                   "models/trilu_offsets_ts.onnx", "models/band_w2_ts.onnx"]
CASE_BUDGET_S = 20.0  # hang guards, loose enough for a loaded CI machine
TOTAL_BUDGET_S = 300.0


class _Timeout(BaseException):  # not an Exception: no `except Exception` on the way may swallow it
    pass


def _alarm(signum, frame):
    raise _Timeout


def test_fuzz_mutated_models(tmp_path, capsys):
    """Mutated models through optimize and inspect: exit 0 (a loadable, checked output) or 2; never 3."""
    seeds = fuzz_models.seed_models()
    for rel in FUZZ_FILE_SEEDS:  # small exported models, when present
        p = os.path.join(ROOT, rel)
        if os.path.exists(p):
            seeds[os.path.basename(rel)] = onnx.load(p)
    rng = random.Random(FUZZ_SEED)
    outcomes: collections.Counter = collections.Counter()
    failures = []
    old = signal.signal(signal.SIGALRM, _alarm)
    start = time.perf_counter()
    try:
        for i in range(FUZZ_CASES):
            name = rng.choice(sorted(seeds))
            data, what = fuzz_models.mutate(seeds[name], rng)
            path = tmp_path / f"case{i}.onnx"
            path.write_bytes(data)
            out = tmp_path / f"case{i}.out.onnx"
            for command in (["optimize", path, "-o", out], ["inspect", path, "--json"]):
                t0 = time.perf_counter()
                signal.setitimer(signal.ITIMER_REAL, CASE_BUDGET_S)
                try:
                    code, o, e = run_cli(command, capsys)
                except _Timeout:
                    code, o, e = "hang", "", ""
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                outcomes[(command[0], code)] += 1
                label = f"case {i} ({name}: {what}) {command[0]}"
                if code == 0 and command[0] == "optimize":
                    try:
                        onnx.checker.check_model(onnx.load(str(out)))
                    except Exception as exc:  # noqa: BLE001
                        failures.append(f"{label}: wrote a model that fails the checker: {exc}")
                elif code == 2:
                    if not e.startswith("dmlgraph: error: ") or "Traceback" in o + e:
                        failures.append(f"{label}: unclear error: {e!r}")
                elif code != 0:
                    failures.append(f"{label}: exit {code}: {e.strip()[:300]}")
                if time.perf_counter() - t0 > CASE_BUDGET_S:
                    failures.append(f"{label}: took {time.perf_counter() - t0:.1f}s")
                if out.exists():
                    out.unlink()
            path.unlink()
    finally:
        signal.signal(signal.SIGALRM, old)
    elapsed = time.perf_counter() - start
    summary = ", ".join(f"{cmd} exit {code}: {n}" for (cmd, code), n in sorted(outcomes.items(), key=str))
    print(f"\nfuzz: {FUZZ_CASES} mutated models of {len(seeds)} seeds x 2 commands in {elapsed:.1f}s: {summary}")
    assert not failures, "\n".join(failures[:20])
    assert elapsed < TOTAL_BUDGET_S
    assert os.listdir(tmp_path) == []  # nothing left behind (no temp files)
    # The fuzz must exercise both outcomes, or it is testing nothing.
    assert outcomes[("optimize", 0)] > 20 and outcomes[("optimize", 2)] > 20


def test_a_closed_pipe_ends_quietly_with_141(tmp_path):
    """`dmlgraph inspect --json | head -c 0`: no 'internal error', the shell's SIGPIPE code."""
    model = os.path.join(os.path.dirname(__file__), "..", "models", "gpt2_ts.onnx")
    proc = subprocess.Popen([sys.executable, "-m", "dmlgraph", "inspect", model, "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader goes away before the JSON is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "internal error" not in err and "Traceback" not in err
