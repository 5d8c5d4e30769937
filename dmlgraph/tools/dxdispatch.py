"""A lowered graph and one bound run -> a DxDispatch model; and checking what DxDispatch computed.

DxDispatch (microsoft/DirectML) runs JSON models of DirectML operators on a real GPU. An export
holds one independent dispatch per DML node at the sizes this run bound, with its real input and
the executor's result as `.npy` files, so a wrong operator shows up alone. Values are spelled as
DxDispatch's JSON parser reads them (a NaN it cannot spell is refused): docs/internals.md, tools/dxdispatch.py.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from dmlgraph import pipeline
from dmlgraph.errors import DmlgraphError, UnsupportedError
from dmlgraph.ir.dtypes import DmlDataType, ScalarUnion, bitwise_equal
from dmlgraph.ir.graph import DmlNode, Graph
from dmlgraph.ir.ops import DiagonalMatrix1Desc, DiagonalMatrixDesc, FeatureLevel
from dmlgraph.ir.tensor import BufferTensorDesc, DescError, packed_strides
from dmlgraph.rewrite import Options
from dmlgraph.runtime.binding import node_desc
from dmlgraph.runtime.executor import DmlCall, Executor

MODEL_FILE = "model.json"
INPUTS_DIR, EXPECTED_DIR, OUTPUT_DIR = "inputs", "expected", "output"

# std::numeric_limits<T>::quiet_NaN() bits: what DxDispatch's "nan" becomes.
_QUIET_NAN_BITS = {4: 0x7FC00000, 8: 0x7FF8000000000000}
_SCALAR_MEMBER = {DmlDataType.FLOAT32: "Float32", DmlDataType.FLOAT64: "Float64"}


# ---- spelling values the way DxDispatch's parser reads them ---------------------------------
def float_json(x: np.floating, field_name: str) -> float | str:
    """A float32/float64 value as DxDispatch's ParseFloatingPointNumber reads it back bit for bit."""
    if np.isfinite(x):
        return float(x)  # exact: a float32 widens to a double exactly; repr round-trips
    if np.isinf(x):
        return "inf" if x > 0 else "-inf"
    bits = int(x.view(f"u{x.itemsize}"))
    if bits != _QUIET_NAN_BITS.get(x.itemsize):
        raise UnsupportedError(
            f"{field_name} is a NaN with bits 0x{bits:0{2 * x.itemsize}X}; DxDispatch can only spell the "
            f"default quiet NaN (0x{_QUIET_NAN_BITS[x.itemsize]:X}), so the export would run another value",
            hint="give the node a finite value, or the default NaN (numpy.nan)")
    return "nan"


def scalar_union_json(value: ScalarUnion) -> int | float | dict:
    """A DML_SCALAR_UNION as DxDispatch's ParseDmlScalarUnion reads it (exact for every type)."""
    dt = value.data_type
    x = value.numpy_value
    if dt == DmlDataType.FLOAT16:
        if np.isfinite(x):
            return float(x)  # float -> half of a representable value is exact
        return {"UInt16": int(x.view(np.uint16))}  # the union carries float16 as its 16 bits
    if dt in _SCALAR_MEMBER:
        spelled = float_json(cast(np.floating, x), "Value")  # FLOAT32 / FLOAT64
        return spelled if isinstance(spelled, float) else {_SCALAR_MEMBER[dt]: spelled}
    return int(x)


def tensor_json(desc: BufferTensorDesc) -> dict:
    """A DML_BUFFER_TENSOR_DESC in DxDispatch's short form (Type BUFFER and Flags NONE by default)."""
    out: dict = {"DataType": desc.data_type.name, "Sizes": list(desc.sizes)}
    if desc.strides is not None and desc.strides != packed_strides(desc.sizes):  # packed = no Strides
        out["Strides"] = list(desc.strides)
    out["TotalTensorSizeInBytes"] = int(_total_bytes(desc))
    if desc.alignment:
        out["GuaranteedBaseOffsetAlignment"] = int(desc.alignment)
    if desc.flags:
        out["Flags"] = "OWNED_BY_DML"
    return out


def operator_json(desc: DiagonalMatrix1Desc | DiagonalMatrixDesc) -> dict:
    """The dispatchable: DML_OPERATOR_DIAGONAL_MATRIX1 or DML_OPERATOR_DIAGONAL_MATRIX with its desc."""
    if isinstance(desc, DiagonalMatrixDesc):
        return {"type": "DML_OPERATOR_DIAGONAL_MATRIX",
                "desc": {"OutputTensor": tensor_json(desc.output), "Offset": int(desc.offset),
                         "Value": float_json(np.float32(desc.value), "Value")}}  # a FLOAT field
    fields: dict = {}
    if desc.input is not None:
        fields["InputTensor"] = tensor_json(desc.input)
    fields.update({"OutputTensor": tensor_json(desc.output), "ValueDataType": desc.value_data_type.name,
                   "Value": scalar_union_json(desc.value), "DiagonalFillBegin": int(desc.begin),
                   "DiagonalFillEnd": int(desc.end)})
    return {"type": "DML_OPERATOR_DIAGONAL_MATRIX1", "desc": fields}


def _total_bytes(desc: BufferTensorDesc) -> int:
    """`desc.total_bytes`: never None once built (`BufferTensorDesc.__init__` computes a missing one)."""
    return cast(int, desc.total_bytes)


def _json_text(model: dict) -> str:
    """Indented JSON with number lists on one line (Sizes, Strides); never NaN/Infinity tokens."""
    text = json.dumps(model, indent=2, allow_nan=False)
    return re.sub(r"\[\s+(-?[\d.e+-]+(?:,\s+-?[\d.e+-]+)*)\s+\]",
                  lambda m: "[" + ", ".join(p.strip() for p in m.group(1).split(",")) + "]", text)


# ---- building an export ---------------------------------------------------------------------
@dataclass
class Export:
    """What `write` puts in DIR: the JSON model, the arrays by relative path, and the report rows."""

    model: dict
    arrays: dict[str, np.ndarray]
    operators: list[dict] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)


def _safe_name(name: str, taken: set[str]) -> str:
    """A resource/file name: ONNX names may hold '/', ':' or spaces; names must stay unique."""
    base = re.sub(r"[^A-Za-z0-9_.-]", "_", name).strip("._") or "dml"
    out, i = base, 2
    while out in taken:
        out, i = f"{base}_{i}", i + 1
    taken.add(out)
    return out


def _buffer(array: np.ndarray, desc: BufferTensorDesc, initial: dict) -> dict:
    """A buffer resource; `sizeInBytes` only where the desc needs more than the data gives."""
    res: dict[str, object] = {"initialValuesDataType": desc.data_type.name, "initialValues": initial}
    have = -(-array.nbytes // 4) * 4  # DxDispatch rounds an unsized buffer up to 4 bytes
    if _total_bytes(desc) > have:
        res["sizeInBytes"] = int(_total_bytes(desc))
    return res


def build(calls: list[DmlCall], level: FeatureLevel = FeatureLevel.L5_1) -> Export:
    """The DxDispatch model of these bound DML calls (one dispatchable each), in run order."""
    exp = Export({"resources": {}, "dispatchables": {}, "commands": []}, {})
    taken: set[str] = set()
    for call in calls:
        node = call.node
        label = node.name or node.outputs[0].name
        if 0 in call.shape:
            exp.skipped.append({"node": label, "reason": f"bound to shape {list(call.shape)}: a zero-size "
                                "dimension is invalid in DirectML (the executor returns an empty tensor)"})
            continue
        if call.matrix is not None and tuple(call.matrix[-2:]) != tuple(call.shape[-2:]):
            raise UnsupportedError(f"{node.kind} node {label!r}: its mask's sizes {list(call.matrix)} are not the output's "
                                   f"matrix {list(call.shape[-2:])} (a dim-name claim these inputs break): the node "
                                   "is that band broadcast, not one DIAGONAL_MATRIX1",
                                   hint="export with inputs whose dims keep the model's dim names")
        try:
            desc = node_desc(node, call.shape, None if call.x is None else call.x.shape, call.k, level)
            op = operator_json(desc)
        except DescError as e:
            raise UnsupportedError(f"{node.kind} node {label!r} at shape {list(call.shape)}: {e}",
                                   hint="re-lower the original model for this feature level "
                                        "(--feature-level), or export at a higher one") from None
        except UnsupportedError as e:
            raise UnsupportedError(f"{node.kind} node {label!r}: {Exception.__str__(e)}", hint=e.hint) from None
        dtype = desc.output.data_type.numpy
        name = _safe_name(label, taken)
        out_res = _safe_name(f"{name}_out", taken)
        expected = np.ascontiguousarray(call.output).astype(dtype, copy=False)  # ONNX bool -> UINT8
        exp.arrays[f"{EXPECTED_DIR}/{out_res}.npy"] = expected
        bindings = {}
        in_res = None
        if isinstance(desc, DiagonalMatrix1Desc) and desc.input is not None:
            in_res = _safe_name(f"{name}_in", taken)
            # a desc with an input comes from a call with one (node_desc gets x's shape)
            x = np.ascontiguousarray(np.atleast_1d(cast(np.ndarray, call.x))).astype(dtype, copy=False)
            path = f"{INPUTS_DIR}/{in_res}.npy"
            exp.arrays[path] = x
            exp.model["resources"][in_res] = _buffer(x, desc.input, {"sourcePath": path})
            bindings["InputTensor"] = in_res
        exp.model["resources"][out_res] = _buffer(expected, desc.output,
                                                  {"valueCount": int(expected.size), "value": 0})
        bindings["OutputTensor"] = out_res
        exp.model["dispatchables"][name] = op
        exp.model["commands"].append({"type": "dispatch", "dispatchable": name, "bindings": bindings})
        exp.model["commands"].append({"type": "writeFile", "resource": out_res,
                                      "targetPath": f"{OUTPUT_DIR}/{out_res}.npy",
                                      "dimensions": [int(d) for d in expected.shape]})
        exp.operators.append({"dispatchable": name, "node": label, "tensor": node.outputs[0].name,
                              "operator": op["type"], "shape": list(call.shape),
                              "data_type": desc.output.data_type.name, "input": in_res, "output": out_res,
                              "desc": op["desc"], "exact_rule": node.exact})
    return exp


def trace(g: Graph, feeds: dict[str, np.ndarray]) -> list[DmlCall]:
    """Run the graph once and return every DML node's bound operands and output."""
    _, calls = Executor(g).run_traced(feeds)
    return calls


# ---- writing DIR (atomically) ----------------------------------------------------------------
def check_target(out_dir: str, force: bool, model_path: str | None = None) -> None:
    """Refuse, before any work, a DIR that cannot be written or must not be replaced."""
    out = os.path.abspath(out_dir)
    parent = os.path.dirname(out)
    if not os.path.isdir(parent):
        raise DmlgraphError(f"cannot write {out_dir}: the folder {parent} does not exist",
                            hint="create it first or choose another output folder")
    if os.path.exists(out) and not os.path.isdir(out):
        raise DmlgraphError(f"cannot write {out_dir}: it is a file, not a folder", hint="choose a folder path")
    if not os.path.isdir(out) or not os.listdir(out):
        return
    if not force:
        raise DmlgraphError(f"{out_dir} exists and is not empty",
                            hint="choose a new folder, or pass --force to replace a previous export")
    if not os.path.isfile(os.path.join(out, MODEL_FILE)):
        raise DmlgraphError(f"refusing to replace {out_dir}: it is not a previous export (no {MODEL_FILE})",
                            hint="choose a new or empty folder")
    inside = [p for p in (os.getcwd(), model_path and os.path.abspath(model_path)) if p]
    if any(os.path.commonpath([out, p]) == out for p in inside):
        raise DmlgraphError(f"refusing to replace {out_dir}: it holds the working directory or the model",
                            hint="choose another output folder")


def write(exp: Export, out_dir: str, force: bool = False, model_path: str | None = None) -> int:
    """Write DIR in a temp folder beside it, then rename it into place; returns the bytes written.

    On failure nothing is left behind and an existing DIR is untouched.
    """
    check_target(out_dir, force, model_path)
    out = os.path.abspath(out_dir)
    parent = os.path.dirname(out)
    old = tmp = None
    try:
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.", suffix=".tmp", dir=parent)
        for sub in (INPUTS_DIR, EXPECTED_DIR):
            os.mkdir(os.path.join(tmp, sub))
        with open(os.path.join(tmp, MODEL_FILE), "w", encoding="utf-8") as f:
            f.write(_json_text(exp.model) + "\n")
        for rel, arr in exp.arrays.items():
            np.save(os.path.join(tmp, rel), arr, allow_pickle=False)
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(tmp) for f in files)
        if os.path.isdir(out):
            if os.listdir(out):  # a previous export (check_target): keep it until the new one is in place
                old = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.", suffix=".old", dir=parent)
                os.rename(out, os.path.join(old, "export"))
            else:
                os.rmdir(out)
        os.rename(tmp, out)
    except OSError as e:  # (a read-only or full folder fails at the temp folder already)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not os.path.exists(out):
            os.rename(os.path.join(old, "export"), out)
            os.rmdir(old)
        raise DmlgraphError(f"cannot write {out_dir}: {e.strerror or e}",
                            hint="check free space and permissions") from None
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return size


# ---- checking what DxDispatch wrote ----------------------------------------------------------
def _binding_name(binding: object) -> str:
    return binding if isinstance(binding, str) else binding.get("name", "") if isinstance(binding, dict) else ""


def _compare(got: np.ndarray, want: np.ndarray) -> str | None:
    """None when bit-exact, else what differs (dtype, shape, or how many elements and the first)."""
    if got.dtype != want.dtype:
        return f"written as {got.dtype}, expected {want.dtype}"
    if got.shape != want.shape:
        return f"written with shape {list(got.shape)}, expected {list(want.shape)}"
    if bitwise_equal(got, want):
        return None
    u = np.dtype(f"u{want.dtype.itemsize}")
    diff = np.ascontiguousarray(got).view(u) != np.ascontiguousarray(want).view(u)
    first = tuple(int(i) for i in np.argwhere(diff)[0])
    return (f"{int(diff.sum())} of {want.size} elements differ; first at {list(first)}: "
            f"got {got[first]!r}, expected {want[first]!r}")


def check(out_dir: str) -> dict:
    """Compare the files DxDispatch wrote with expected/, per operator, bit for bit.

    Raises DmlgraphError (exit 2) when DIR is not an export or DxDispatch's files are missing.
    """
    path = os.path.join(out_dir, MODEL_FILE)
    if not os.path.isfile(path):
        raise DmlgraphError(f"{out_dir} has no {MODEL_FILE}",
                            hint="give the folder written by `dmlgraph dxdispatch MODEL -o DIR`")
    try:
        with open(path, encoding="utf-8") as f:
            model = json.load(f)
        commands = model["commands"]
        writes = {c["resource"]: c["targetPath"] for c in commands if c.get("type") == "writeFile"}
        dispatches = [(c["dispatchable"], _binding_name(c["bindings"].get("OutputTensor")))
                      for c in commands if c.get("type") == "dispatch"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise DmlgraphError(f"{path} is not a DxDispatch model written by dmlgraph ({type(e).__name__}: {e})",
                            hint="export it again with `dmlgraph dxdispatch MODEL -o DIR --force`") from None
    rows, missing = [], []
    for name, res in dispatches:
        want_path = os.path.join(out_dir, EXPECTED_DIR, f"{res}.npy")
        if res not in writes or not os.path.isfile(want_path):
            raise DmlgraphError(f"{out_dir}: operator {name!r} has no writeFile command or expected/{res}.npy",
                                hint="the export is incomplete; export it again with --force")
        got_path = os.path.join(out_dir, writes[res])
        if not os.path.isfile(got_path):
            missing.append(writes[res])
            continue
        want = np.load(want_path, allow_pickle=False)
        try:
            got = np.load(got_path, allow_pickle=False)  # DxDispatch may append buffer padding: not read
            detail = _compare(got, want)
        except (OSError, ValueError) as e:
            detail = f"unreadable .npy: {e}"
        rows.append({"dispatchable": name, "resource": res, "file": writes[res], "match": detail is None,
                     "detail": detail or "bit-exact"})
    if missing:
        raise DmlgraphError(
            f"DxDispatch's output is missing for {len(missing)} of {len(dispatches)} operators in {out_dir} "
            f"(first: {missing[0]})",
            hint=f"run `dxdispatch.exe {MODEL_FILE}` inside {out_dir} (writeFile paths are relative to its "
                 "working directory, or pass --output_path), then check again")
    return {"dir": out_dir, "operators": rows, "ok": all(r["match"] for r in rows),
            "matched": sum(r["match"] for r in rows), "total": len(rows)}


# ---- the command's two halves as plain functions ---------------------------------------------
def export(model_path: str, out_dir: str, feeds: dict[str, np.ndarray] | None = None,
           dims: dict[str, int] | None = None, seed: int = 0, options: Options | None = None,
           force: bool = False) -> dict:
    """Lower MODEL if it has no DML node yet, run it on `feeds` (else generated inputs), write DIR."""
    options = options or Options()
    check_target(out_dir, force, model_path)  # fail before the run, not after
    _, g = pipeline.load(model_path)
    lowered_here = not any(isinstance(n, DmlNode) for n in g.nodes.values())
    fed = feeds is not None
    if feeds is not None:
        pipeline.check_feeds(g, feeds)
    else:
        feeds = pipeline.make_inputs(g, dims, seed)
    if lowered_here:
        pipeline.optimize_graph(g, options)
        g.remove_dead()
    with contextlib.nullcontext() if fed else pipeline.generated_inputs_hint(g, dims):
        calls = trace(g, pipeline.apply_overrides(g, feeds))  # (a fed initializer the model lets callers replace)
    if not calls:
        raise DmlgraphError(f"{model_path} has nothing to export: no computation lowers to a DML operator "
                            f"at feature level {options.feature_level.label}",
                            hint=f"`dmlgraph inspect {model_path}` says what was found and why it was declined")
    exp = build(calls, options.feature_level)
    if not exp.operators:
        raise DmlgraphError(f"{model_path}: every DML node was bound to a zero-size shape at these inputs",
                            hint="pass inputs with non-zero sizes (--inputs or --dim NAME=SIZE)")
    size = write(exp, out_dir, force, model_path)
    return {"model": model_path, "dir": out_dir, "feature_level": options.feature_level.label,
            "lowered_here": lowered_here, "inputs": {k: [str(v.dtype), list(v.shape)] for k, v in feeds.items()},
            "operators": exp.operators, "skipped": exp.skipped, "files": 1 + len(exp.arrays), "bytes": size}


def export_text(r: dict) -> str:
    """The export report as text: one line per operator, then where to go next."""
    lines = [f"{'lowered and ' if r['lowered_here'] else ''}exported {len(r['operators'])} operator(s) "
             f"from {r['model']} (feature level {r['feature_level']})"]
    for op in r["operators"]:
        d = op["desc"]
        bounds = (f"Begin {d['DiagonalFillBegin']}, End {d['DiagonalFillEnd']}" if "DiagonalFillBegin" in d
                  else f"Offset {d['Offset']}")
        lines.append(f"  {op['dispatchable']}: {op['operator'].removeprefix('DML_OPERATOR_')} "
                     f"{op['data_type']}{op['shape']}, {bounds}, Value {json.dumps(d['Value'])}"
                     f"{', input ' + op['input'] if op['input'] else ''}")
    for s in r["skipped"]:
        lines.append(f"  not exported: {s['node']}: {s['reason']}")
    lines.append(f"wrote {r['dir']} ({r['files']} files, {r['bytes']:,} bytes)")
    lines.append(f"next, on Windows: cd {r['dir']} && dxdispatch.exe {MODEL_FILE}; "
                 f"then: dmlgraph dxdispatch --check {r['dir']}")
    return "\n".join(lines)


def check_text(r: dict) -> str:
    """The check report as a table: one row per operator."""
    w = max([len(row["dispatchable"]) for row in r["operators"]] + [12])
    lines = [f"{'dispatchable':{w}}  result"]
    lines += [f"{row['dispatchable']:{w}}  {'ok  ' if row['match'] else 'FAIL'} {row['detail']}"
              for row in r["operators"]]
    lines.append(f"{r['matched']} of {r['total']} operators bit-exact")
    return "\n".join(lines)
