"""The Python API as a user calls it: `import dmlgraph` and its typed results.

Library calls read the caller's model and never change it, and leave the process as they found
it: gc state, rlimits, signal handlers, child processes.
"""
from __future__ import annotations

import copy
import gc
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import venv

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import dmlgraph
from dmlgraph.io.resources import DEMO_MODEL, bundled_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = bundled_model(DEMO_MODEL)
DIMS = {"seq": 5, "batch": 2}


def _trilu_model() -> onnx.ModelProto:
    g = h.make_graph([h.make_node("Trilu", ["x"], ["t"], upper=0), h.make_node("Relu", ["t"], ["y"])], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, ["n", "n"])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["n", "n"])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 18)], ir_version=10)


def test_optimize_a_model_in_memory_without_changing_it(tmp_path):
    model = onnx.load(DEMO)
    kept = copy.deepcopy(model)
    result = dmlgraph.optimize(model)
    assert model == kept
    assert isinstance(result.model, onnx.ModelProto) and result.model is not model
    assert result.counts["mask_subgraph"] == 2 and result.counts["mask_where"] == 1
    assert {r.rule for r in result.rewrites} == {"mask_subgraph", "mask_where"}
    assert all(r.op == "DiagonalMatrix1" and r.exact for r in result.rewrites)
    assert result.before["nodes"] > result.after["nodes"]
    size = result.save(tmp_path / "lowered.onnx")
    assert size == os.path.getsize(tmp_path / "lowered.onnx")
    onnx.checker.check_model(str(tmp_path / "lowered.onnx"), full_check=True)
    assert json.loads(result.to_json())["rewrites"] == result.counts


@pytest.mark.parametrize("name", ["optimize", "inspect", "run", "validate"])
def test_help_documents_every_parameter_and_the_error(name):
    """help(dmlgraph.X) names every keyword, what it returns and the exception it raises."""
    import inspect as pyinspect
    fn = getattr(dmlgraph, name)
    doc = pyinspect.getdoc(fn) or ""
    for param in list(pyinspect.signature(fn).parameters)[1:]:
        assert param in doc, f"{name}: {param} is not documented"
    assert "DmlgraphError" in doc
    for cls in (dmlgraph.OptimizeResult, dmlgraph.ValidationResult):
        fields = [f for f in cls.__dataclass_fields__ if f not in ("original", "checked_bytes")]
        assert all(f"`{f}`" in (cls.__doc__ or "") for f in fields), cls.__name__


def test_optimize_a_path_and_the_options():
    exact = dmlgraph.optimize(DEMO, exact=True, target="onnx")
    assert exact.report["model"] == DEMO  # (the report named every input "<in-memory model>")
    assert "DiagonalMatrix1" not in {n.op_type for n in exact.model.graph.node}  # expanded to standard ops
    low = dmlgraph.optimize(_trilu_model(), feature_level="4_0")
    assert low.counts["trilu"] == 0 and [d.rule for d in low.declined] == ["trilu"]
    assert "feature level" in low.declined[0].reason
    with pytest.raises(dmlgraph.DmlgraphError, match="unknown target"):
        dmlgraph.optimize(DEMO, target="cuda")


def test_save_refuses_to_replace_the_input_unless_asked(tmp_path):
    path = str(tmp_path / "m.onnx")
    shutil.copy(DEMO, path)
    result = dmlgraph.optimize(path)
    with pytest.raises(dmlgraph.ModelError, match="refusing to overwrite"):
        result.save(path)
    result.save(path, in_place=True)
    assert dmlgraph.optimize(path).counts["mask_subgraph"] == 0  # already lowered


def test_an_invalid_model_in_memory_is_a_model_error():
    broken = _trilu_model()
    broken.graph.node[1].input[0] = "nowhere"
    with pytest.raises(dmlgraph.ModelError, match="dangling input"):
        dmlgraph.optimize(broken)


def test_inspect_candidates_declines_and_json():
    model = onnx.load(DEMO)
    kept = copy.deepcopy(model)
    found = dmlgraph.inspect(model)
    assert model == kept
    assert [c["rule"] for c in found.candidates] == ["mask_subgraph", "mask_subgraph", "mask_where"]
    assert found.declined == [] and found.totals["candidates"] == 3
    assert json.loads(found.to_json())["candidates"][0]["rule"] == "mask_subgraph"
    assert dmlgraph.inspect(_trilu_model(), feature_level="4_0").declined[0]["rule"] == "trilu"


def test_run_and_validate():
    result = dmlgraph.optimize(DEMO)
    check = dmlgraph.validate(DEMO, result, dims=DIMS)
    assert check.ok and check.exact
    assert {t.name for t in check.outputs} == {o.name for o in result.model.graph.output}
    assert all(t.match and t.detail == "bit-exact" for t in check.tensors + check.outputs)
    outputs = dmlgraph.run(result.model, check.inputs)
    expected = dmlgraph.run(DEMO, check.inputs)
    assert outputs.keys() == expected.keys()
    for name in outputs:
        np.testing.assert_array_equal(outputs[name], expected[name])
    again = dmlgraph.validate(DEMO, result.model, check.inputs)  # given inputs, a ModelProto
    assert again.ok and again.inputs.keys() == check.inputs.keys()
    with pytest.raises(dmlgraph.DmlgraphError, match="missing inputs"):
        dmlgraph.run(DEMO, {})


def test_validate_and_run_take_onnxruntimes_thread_count(monkeypatch):
    """`threads` reaches every onnxruntime session both models run in (sizes_report passes 1)."""
    from dmlgraph.runtime import onnx_runner
    seen: list[int] = []
    init = onnx_runner.OnnxRunner.__init__

    def spy(self, *a, **k):
        init(self, *a, **k)
        if self.session is not None:
            seen.append(self.session.get_session_options().intra_op_num_threads)
    monkeypatch.setattr(onnx_runner.OnnxRunner, "__init__", spy)
    assert dmlgraph.validate(DEMO, dims=DIMS, threads=1).ok
    assert seen and set(seen) == {1}
    seen.clear()
    dmlgraph.run(DEMO, dmlgraph.validate(DEMO, dims=DIMS, threads=3).inputs, threads=2)
    assert seen and set(seen) == {3, 2}
    for bad in (0, -1, 1.5, "2", True):  # (onnxruntime took -1, and raised a bare TypeError for 1.5)
        with pytest.raises(dmlgraph.DmlgraphError, match="thread count"):
            dmlgraph.run(DEMO, {}, threads=bad)  # type: ignore[arg-type]
        with pytest.raises(dmlgraph.DmlgraphError, match="thread count"):
            dmlgraph.validate(DEMO, dims=DIMS, threads=bad)  # type: ignore[arg-type]


def test_the_demo_prints_the_validate_commands_it_runs(capsys):
    """Each `$ dmlgraph validate ...` line the demo prints, run as printed, gives the demo's inputs."""
    from dmlgraph.tools import cli
    assert cli.main(["demo"]) == 0
    blocks = capsys.readouterr().out.split("\n$ ")[1:]
    assert len(blocks) == 2
    for block in blocks:
        command, inputs = block.splitlines()[:2]
        assert command.startswith("dmlgraph validate ") and inputs.startswith("inputs: ")
        assert cli.main(command.split()[1:]) == 0
        assert capsys.readouterr().out.splitlines()[0] == inputs


def test_api_errors_speak_of_the_arguments_not_of_cli_flags_or_files():
    """A dict of inputs is not an 'inputs file', and dims= is not '--dim'."""
    for call in (lambda: dmlgraph.run(DEMO, {}), lambda: dmlgraph.run(DEMO, {"nope": np.zeros(1)}),
                 lambda: dmlgraph.validate(DEMO, dims={"nope": 3})):
        with pytest.raises(dmlgraph.DmlgraphError) as e:
            call()
        assert "file" not in str(e.value).splitlines()[0] and "--" not in str(e.value).splitlines()[0]


def test_validate_reports_a_wrong_lowering():
    result = dmlgraph.optimize(DEMO)
    wrong = copy.deepcopy(result.model)
    for node in wrong.graph.node:
        if node.op_type == "DiagonalMatrix1":
            for a in node.attribute:
                if a.name == "end":
                    a.i += 1
    check = dmlgraph.validate(DEMO, wrong, dims=DIMS)
    assert not check.ok and any(not t.match for t in check.tensors)


# ---- no process-wide side effects ---------------------------------------------------------------
@pytest.fixture
def watched(monkeypatch):
    """Records every gc.disable, setrlimit, fork and signal handler change made meanwhile."""
    calls: list[str] = []
    for mod, name in ((gc, "disable"), (resource, "setrlimit"), (os, "fork"), (signal, "signal")):
        real = getattr(mod, name)

        def spy(*a, _real=real, _name=name, **k):
            calls.append(_name)
            return _real(*a, **k)
        monkeypatch.setattr(mod, name, spy)
    return calls


def _process_state() -> tuple:
    limits = tuple(resource.getrlimit(r) for r in (resource.RLIMIT_AS, resource.RLIMIT_DATA))
    handlers = tuple(signal.getsignal(s) for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP))
    return gc.isenabled(), limits, handlers


def test_library_calls_leave_the_process_as_they_found_it(watched):
    before = _process_state()
    result = dmlgraph.optimize(DEMO)
    dmlgraph.inspect(DEMO)
    dmlgraph.validate(DEMO, result, dims=DIMS)
    assert watched == []  # no gc pause, no rlimit, no child, no signal handler
    assert _process_state() == before


def test_the_process_owner_can_opt_in(watched):
    before = _process_state()
    with dmlgraph.process_wide():
        dmlgraph.optimize(DEMO)
    assert "disable" in watched  # the gc pause (children and caps depend on the machine and model)
    assert _process_state() == before


# ---- installed ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_wheel_installs_a_working_demo_and_its_models(tmp_path):
    """Build the wheel, install it into a fresh venv (reusing this one's packages), and run
    `dmlgraph demo` from a folder with no checkout in sight; the wheel carries the bundled models, not the
    benchmarks or the torch export scripts."""
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels),
                    ROOT], check=True, capture_output=True)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=False, with_pip=False)
    site = subprocess.run([str(env_dir / "bin" / "python"), "-c", "import site; print(site.getsitepackages()[0])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    here = [p for p in sys.path if p.endswith("site-packages")][0]
    with open(os.path.join(site, "deps.pth"), "w") as f:  # numpy, onnx, onnxruntime from this venv
        f.write(here + "\n")
    wheel = next(wheels.glob("dmlgraph-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", site, str(wheel)],
                   check=True, capture_output=True)
    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    demo = subprocess.run([str(env_dir / "bin" / "python"), "-m", "dmlgraph", "demo"], cwd=away, env=env,
                          capture_output=True, text=True)
    assert demo.returncode == 0, demo.stderr
    assert "PASS" in demo.stdout
    where = subprocess.run([str(env_dir / "bin" / "python"), "-c",
                            "import os, dmlgraph, dmlgraph.io.resources as r; print(dmlgraph.__file__); "
                            "print(sorted(os.listdir(r.models_dir()))); print(os.listdir(r.bundled_model('synthetic')))"],
                           cwd=away, env=env, capture_output=True, text=True, check=True).stdout
    assert ROOT not in where and "gpt2_ts.onnx" in where and "causal_attention.onnx" in where
    assert "scripts" not in where and "make_models" not in where
    names = subprocess.run([sys.executable, "-m", "zipfile", "-l", str(wheel)], capture_output=True, text=True).stdout
    assert "benchmarks/" not in names and "make_kv_models" not in names
    # The rules install once, as dmlgraph.passes, though dmlgraph/passes is also a symlink to passes/ (for mypy).
    rules = [line.split()[0] for line in names.splitlines() if "/passes/" in line and line.split()[0].endswith(".py")]
    top = os.path.join(ROOT, "passes")
    sources = [f"dmlgraph/passes/{os.path.relpath(os.path.join(d, f), top).replace(os.sep, '/')}"
               for d, _, files in os.walk(top) for f in files if f.endswith(".py")]
    assert sorted(rules) == sorted(sources)


def test_save_checks_again_only_a_model_changed_since_optimize(tmp_path, monkeypatch):
    """optimize checks what it made; saving it unchanged does not check again, a changed one is checked."""
    from dmlgraph import pipeline
    calls = []
    real = pipeline.full_check_failure
    monkeypatch.setattr(pipeline, "full_check_failure", lambda m: calls.append(m) or real(m))
    result = dmlgraph.optimize(DEMO)
    assert result.checked_bytes == result.model.SerializeToString(deterministic=True)
    result.save(tmp_path / "a.onnx")
    assert calls == []
    result.model.graph.node[0].input[0] = "nowhere"  # no longer the model optimize checked: refused
    with pytest.raises(AssertionError, match="fails onnx's"):
        result.save(tmp_path / "b.onnx")
    assert not os.path.exists(tmp_path / "b.onnx")


def test_save_serializes_an_unchanged_model_once(tmp_path, monkeypatch):
    """The bytes written are the bytes compared with what optimize checked: one serialization."""
    result = dmlgraph.optimize(DEMO)
    calls = []
    real = onnx.ModelProto.SerializeToString
    monkeypatch.setattr(onnx.ModelProto, "SerializeToString", lambda m, **k: calls.append(m) or real(m, **k))
    result.save(tmp_path / "a.onnx")
    assert len(calls) == 1
    assert (tmp_path / "a.onnx").read_bytes() == result.checked_bytes


def test_rewrites_name_unnamed_and_nested_nodes():
    """`Rewrite.nodes` never holds an empty name: an unnamed node is its op type and output, and a
    node inside a body follows the body's path."""
    assert [r.nodes for r in dmlgraph.optimize(_trilu_model()).rewrites] == [("Trilu -> t",)]
    body = h.make_graph([h.make_node("Trilu", ["x"], ["t"], upper=1)], "then", [],
                        [h.make_tensor_value_info("t", T.FLOAT, ["n", "n"])])
    other = h.make_graph([h.make_node("Identity", ["x"], ["u"])], "else", [],
                         [h.make_tensor_value_info("u", T.FLOAT, ["n", "n"])])
    g = h.make_graph([h.make_node("If", ["c"], ["y"], name="branch", then_branch=body, else_branch=other)], "g",
                     [h.make_tensor_value_info("c", T.BOOL, []), h.make_tensor_value_info("x", T.FLOAT, ["n", "n"])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["n", "n"])])
    nested = dmlgraph.optimize(h.make_model(g, opset_imports=[h.make_opsetid("", 18)], ir_version=10))
    assert [r.nodes for r in nested.rewrites] == [("branch/then_branch/Trilu -> t",)]
