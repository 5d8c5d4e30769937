"""Find and check the diagonal-structured (band) tensors of the models in models/, numerically.

Runs under the project's venv (onnx, onnxruntime, numpy only; no torch, no dmlgraph import, so it
checks dmlgraph rather than agreeing with it):

    .venv/bin/python models/inspect_masks.py discover models/gpt2_ts.onnx   # print every band tensor
    .venv/bin/python models/inspect_masks.py write                          # regenerate expected.json
    .venv/bin/python models/inspect_masks.py check                          # verify expected.json

How: every node output of the model is added as an extra graph output and the model is run in
onnxruntime (graph optimizations off) on several feeds: two different sequence lengths where the
model has dynamic axes, and a padded attention_mask where it has one. Initializers and Constant
nodes are read directly. A tensor is band-structured when, in every run, each of its trailing
[H, W] slices equals one DIAGONAL_MATRIX1 pattern with the same parameters:

    topX = x - y; useValue = (End >= Begin) ^ (topX >= Begin) ^ (topX < End)
    out = Value if useValue else (Input[coord] if input else 0)

Two shapes of fit are tried:
  * generator: a two-valued tensor {value, other} (other = 0/False when one of the two is zero,
    else the value on the main diagonal), i.e. DIAGONAL_MATRIX1 without input when other == 0, or
    with a broadcast scalar input `other`;
  * application: a node output O that equals one of the node's data inputs X except on a band of
    diagonals where it is a constant c (Where(mask, X, c), Trilu(X, k), X.masked_fill(...)), i.e.
    DIAGONAL_MATRIX1(input X, Value c).
Begin/End are canonical: a side that covers every diagonal of the slice is INT32_MIN / INT32_MAX, so
the parameters do not depend on the sequence length. A tensor that is a band only because the
attention_mask happens to be all ones (padding combined in) drops out in the padded run.

`write` keeps, per model, the band tensors that matter for lowering: every stored constant that is a
band (stored_mask), every application (mask_application / trilu on data), and every generated band
tensor on the frontier of a band region (some consumer produces a non-band tensor), which is the
tensor a mask subgraph collapses to. The per-file metadata (source, exporter, inputs, dynamic axes)
comes from export_log.json written by make_models.py.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1


# --------------------------------------------------------------------------------------------
# the DIAGONAL_MATRIX1 formula and the fits
# --------------------------------------------------------------------------------------------

def use_value(h: int, w: int, begin: int, end: int) -> np.ndarray:
    """[h, w] bool: DIAGONAL_MATRIX1's useValue, straight from the spec's pseudocode."""
    top_x = np.arange(w, dtype=np.int64)[None, :] - np.arange(h, dtype=np.int64)[:, None]
    return (end >= begin) ^ (top_x >= begin) ^ (top_x < end)


def _interval_params(sel: np.ndarray, h: int, w: int):
    """sel[d + h - 1] says whether diagonal topX = d takes Value. Return (begin, end) or None."""
    n = sel.size
    idx = np.flatnonzero(sel)
    if idx.size == 0 or idx.size == n:
        return None  # all or nothing: not a band (a constant)
    lo_d, hi_d = -(h - 1), w - 1
    if idx[-1] - idx[0] + 1 == idx.size:  # one run of diagonals: [lo, hi]
        lo, hi = idx[0] - (h - 1), idx[-1] - (h - 1)
        begin = INT32_MIN if lo == lo_d else int(lo)
        end = INT32_MAX if hi == hi_d else int(hi + 1)
        return begin, end
    nidx = np.flatnonzero(~sel)  # complement is one run inside: inverted band
    if nidx[-1] - nidx[0] + 1 == nidx.size:
        lo, hi = nidx[0] - (h - 1), nidx[-1] - (h - 1)
        return int(hi + 1), int(lo)
    return None


def _per_diagonal(mask3: np.ndarray, h: int, w: int, how: str) -> np.ndarray:
    """Reduce a [n, h, w] bool array per diagonal: 'any' or 'all'."""
    flat = mask3.any(0) if how == "any" else mask3.all(0)
    d = (np.arange(w)[None, :] - np.arange(h)[:, None] + h - 1).ravel()
    cnt = np.bincount(d, minlength=h + w - 1)
    hit = np.bincount(d, weights=flat.ravel().astype(np.float64), minlength=h + w - 1)
    return hit > 0 if how == "any" else hit == cnt


def _same(a: np.ndarray, b) -> np.ndarray:
    if np.issubdtype(a.dtype, np.floating):
        return (a == b) | (np.isnan(a) & np.isnan(b))
    return a == b


def fit_generator(t: np.ndarray):
    """A two-valued band tensor -> dict(begin, end, value, other) or None."""
    if t.ndim < 2 or t.shape[-1] < 2 or t.shape[-2] < 2 or t.size == 0:
        return None
    if not (np.issubdtype(t.dtype, np.number) or t.dtype == np.bool_):
        return None
    vals = np.unique(t)
    if np.issubdtype(t.dtype, np.floating) and np.isnan(vals).any():
        return None
    if vals.size != 2:
        return None
    h, w = t.shape[-2:]
    zero = t.dtype.type(0)
    if zero in vals:
        other = zero
    else:
        other = t.reshape(-1, h, w)[0, 0, 0]
    value = vals[0] if vals[1] == other else vals[1]
    u = (t == value).reshape(-1, h, w)
    sel = _per_diagonal(u, h, w, "any")
    if not np.array_equal(sel, _per_diagonal(u, h, w, "all")):
        return None  # some diagonal is not constant
    p = _interval_params(sel, h, w)
    if p is None:
        return None
    begin, end = p
    want = np.where(use_value(h, w, begin, end), value, other)
    if not np.array_equal(np.broadcast_to(want, t.shape), t):
        return None
    return {"begin": begin, "end": end, "value": value.item(), "other": other.item(),
            "dtype": str(t.dtype)}


def fit_application(o: np.ndarray, x: np.ndarray):
    """o == x except on a band of diagonals where o is one constant c -> dict or None."""
    if o.ndim < 2 or o.shape[-1] < 2 or o.shape[-2] < 2 or o.size == 0 or x.dtype != o.dtype:
        return None
    try:
        xb = np.broadcast_to(x, o.shape)
    except ValueError:
        return None
    if xb.ndim < 2 or x.ndim < 2 or x.shape[-2:] != o.shape[-2:]:
        return None  # the data must vary over the last two axes, or this is a generator
    changed = ~_same(o, xb)
    if not changed.any():
        return None
    cvals = np.unique(o[changed])
    if cvals.size != 1:
        return None
    c = cvals[0]
    h, w = o.shape[-2:]
    sel = _per_diagonal(changed.reshape(-1, h, w), h, w, "any")
    if not _per_diagonal(_same(o, c).reshape(-1, h, w), h, w, "all")[sel].all():
        return None
    p = _interval_params(sel, h, w)
    if p is None:
        return None
    begin, end = p
    want = np.where(use_value(h, w, begin, end), c, xb)
    if not _same(want, o).all():
        return None
    return {"begin": begin, "end": end, "value": c.item(), "other": "input", "dtype": str(o.dtype)}


def describe(fit: dict) -> str:
    b, e = fit["begin"], fit["end"]
    v, o = _jsonval(fit["value"]), _jsonval(fit["other"])
    if b == INT32_MIN and e == INT32_MAX:
        cond = "everywhere"
    elif b > e:
        cond = f"x-y >= {b} or x-y < {e}"
    elif b == INT32_MIN:
        cond = f"x-y < {e}"
    elif e == INT32_MAX:
        cond = f"x-y >= {b}"
    elif e == b + 1:
        cond = f"x-y == {b}"
    else:
        cond = f"{b} <= x-y < {e}"
    label = "band"
    if (b, e) in ((INT32_MIN, 1), (1, INT32_MAX)):
        label = "causal"
    elif e == b + 1:
        label = "diagonal" if b else "identity"
    elif b > e:
        label = "inverted band (outside a window)"
    elif b == INT32_MIN or e == INT32_MAX:
        label = "triangular"
    return f"{label}: {v} where {cond}, else {o}"


def _jsonval(v):
    if isinstance(v, float):
        if np.isnan(v):
            return "nan"
        if np.isinf(v):
            return "inf" if v > 0 else "-inf"
    if isinstance(v, bool):
        return int(v)
    return v


# --------------------------------------------------------------------------------------------
# running a model with every intermediate exposed
# --------------------------------------------------------------------------------------------

DIM_SIZES = {"batch": 2, "mem_len": 5}


def _dim(d, length):
    if d.dim_value:
        return d.dim_value
    name = d.dim_param
    if name in DIM_SIZES:
        return DIM_SIZES[name]
    if name == "cols":
        return length + 3
    return length


def random_feeds(model: onnx.ModelProto, size: Callable[[onnx.TensorShapeProto.Dimension], int], seed: int,
                 mask: Callable[[str, np.ndarray], np.ndarray | None]) -> dict:
    """Random data for every graph input that is not an initializer: `size` gives each dim, `mask`
    an attention mask (ones, with the caller's padding) for an input it recognizes, else None."""
    rng = np.random.default_rng(seed)
    inits = {i.name for i in model.graph.initializer}
    feeds = {}
    for i in model.graph.input:
        if i.name in inits:
            continue
        tt = i.type.tensor_type
        ones = np.ones([size(d) for d in tt.shape.dim], onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
        given = mask(i.name, ones)
        if given is not None:
            feeds[i.name] = given
        elif np.issubdtype(ones.dtype, np.integer):
            feeds[i.name] = rng.integers(0, 100, ones.shape).astype(ones.dtype)
        else:
            feeds[i.name] = rng.standard_normal(ones.shape).astype(ones.dtype)
    return feeds


def make_feeds(model: onnx.ModelProto, length: int, seed: int, pad: bool) -> dict:
    def mask(name: str, a: np.ndarray) -> np.ndarray | None:
        if name != "attention_mask":
            return None
        if pad:
            a[-1, -2:] = 0  # right padding in the last row
            a[0, :1] = 0  # left padding in the first row
        return a

    return random_feeds(model, lambda d: _dim(d, length), seed, mask)


def has_dynamic(model: onnx.ModelProto) -> bool:
    return any(d.dim_param for i in model.graph.input for d in i.type.tensor_type.shape.dim)


def run_all(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    for n in m.graph.node:
        for o in n.output:
            if o and o not in have:
                m.graph.output.append(onnx.ValueInfoProto(name=o))
                have.add(o)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    vals = dict(zip(names, sess.run(None, feeds)))
    for i in model.graph.initializer:
        vals[i.name] = numpy_helper.to_array(i)
    vals.update(feeds)
    return vals


def feed_plan(model: onnx.ModelProto):
    dyn = has_dynamic(model)
    lengths = [7, 12] if dyn else [0]
    plan = [(n, 1 + k, False) for k, n in enumerate(lengths)]
    plan.append((lengths[0], 9, any(i.name == "attention_mask" for i in model.graph.input)))
    return plan


# --------------------------------------------------------------------------------------------
# discovery
# --------------------------------------------------------------------------------------------

def discover(path: str) -> list[dict]:
    model = onnx.load(path)
    producers = {o: n for n in model.graph.node for o in n.output}
    inits = {i.name for i in model.graph.initializer}
    consumers: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    runs = [run_all(model, make_feeds(model, L, s, pad)) for (L, s, pad) in feed_plan(model)]

    def stable(fits):
        if any(f is None for f in fits):
            return None
        keys = ("begin", "end", "value", "other", "dtype")
        f0 = fits[0]
        for f in fits[1:]:
            if any(_jsonval(f[k]) != _jsonval(f0[k]) for k in keys):
                return None
        return f0

    gens: dict[str, dict] = {}
    for name in runs[0]:
        if name in runs[0] and all(name in r for r in runs):
            f = stable([fit_generator(np.asarray(r[name])) for r in runs])
            if f:
                gens[name] = f
    apps: dict[str, dict] = {}
    for n in model.graph.node:
        if not n.output or n.output[0] in gens:
            continue
        o = n.output[0]
        for x in n.input:
            if not x or x in gens or x not in runs[0]:
                continue
            f = stable([fit_application(np.asarray(r[o]), np.asarray(r[x])) for r in runs])
            if f:
                f["data_input"] = x
                apps[o] = f
                break

    out = []
    for name, f in gens.items():
        prod = producers.get(name)
        if name in inits or (prod is not None and prod.op_type == "Constant"):
            kind = "stored_mask"
        elif prod is not None and prod.op_type == "Trilu":
            kind = "trilu"
        elif prod is not None and prod.op_type == "EyeLike":
            kind = "eyelike"
        else:
            kind = "mask_subgraph"
        cons = consumers.get(name, [])
        frontier = (not cons) or any(any(o not in gens for o in c.output if o) for c in cons)
        shape = list(np.asarray(runs[0][name]).shape)
        out.append(dict(f, name=name, kind=kind, frontier=frontier, shape=shape,
                        node=(prod.name if prod is not None else None),
                        op_type=(prod.op_type if prod is not None else "initializer")))
    for name, f in apps.items():
        prod = producers[name]
        kind = "trilu" if prod.op_type == "Trilu" else "mask_application"
        out.append(dict(f, name=name, kind=kind, frontier=True, shape=list(np.asarray(runs[0][name]).shape),
                        node=prod.name, op_type=prod.op_type))
    order = {n: i for i, n in enumerate([i.name for i in model.graph.initializer] +
                                        [o for n in model.graph.node for o in n.output])}
    out.sort(key=lambda e: order.get(e["name"], -1))
    return out


def select(found: list[dict]) -> list[dict]:
    keep = []
    for f in found:
        if f["kind"] in ("stored_mask", "mask_application", "trilu", "eyelike") or f["frontier"]:
            keep.append(f)
    return keep


def exactness(f: dict) -> str:
    if f["other"] != "input":
        return "bit-exact"
    op = f["op_type"]
    if op in ("Where", "Trilu"):
        return "bit-exact"
    if op == "Add":
        return "equal for finite input (inf + -inf is NaN)"
    if op == "Mul":
        return "equal up to the sign of zero (-x*0 is -0.0); NaN where input is inf/NaN"
    return "equal on the tested inputs"


def to_entry(f: dict) -> dict:
    if isinstance(f["value"], float) and f["value"] == 0.0:
        f = dict(f, value=0.0)  # Mul by a 0/1 band gives -0.0 for negative inputs; report 0.0
    return {"kind": f["kind"], "onnx_nodes_or_initializer": f["name"],
            "producer": f"{f['op_type']} {f['node']}" if f["node"] else "initializer",
            "begin": f["begin"], "end": f["end"], "value": _jsonval(f["value"]),
            "other": _jsonval(f["other"]) if f["other"] != "input" else f"input:{f['data_input']}",
            "dtype": f["dtype"], "shape_at_len7": f["shape"], "exact": exactness(f),
            "semantics": describe(f)}


# --------------------------------------------------------------------------------------------
# expected.json
# --------------------------------------------------------------------------------------------

def _inputs_meta(model: onnx.ModelProto) -> dict:
    inits = {i.name for i in model.graph.initializer}
    res = {}
    for i in model.graph.input:
        if i.name in inits:
            continue
        tt = i.type.tensor_type
        res[i.name] = {"dtype": onnx.TensorProto.DataType.Name(tt.elem_type).lower(),
                       "shape": [d.dim_param or d.dim_value for d in tt.shape.dim]}
    return res


_HF = ("transformers 5.x builds the mask at run time in masking_utils (no stored causal buffer in this "
       "version): Range/Unsqueeze/LessOrEqual (causal) [and Greater for the sliding window], And-ed with an "
       "all-true scalar, then And-ed with the padding mask gathered from attention_mask, then "
       "Where(mask, 0, finfo.min). Only the part before the padding And is a band (the later tensors "
       "depend on attention_mask and drop out in the padded run), so there is no band mask_application.")
NOTES = {
    "gpt2_ts.onnx": _HF, "gpt2_dynamo.onnx": _HF, "llama_ts.onnx": _HF, "llama_dynamo.onnx": _HF,
    "mistral_sw4_ts.onnx": _HF + " Sliding window 4: keep y-3 <= x <= y (begin -3, end 1).",
    "mistral_sw4_dynamo.onnx": _HF + " Sliding window 4: keep y-3 <= x <= y (begin -3, end 1).",
    "bert_ts.onnx": "Negative case: bidirectional encoder. Its mask is the padding mask only "
                    "(an all-true GreaterOrEqual, not a band); nothing to lower.",
    "bert_dynamo.onnx": "Negative case: bidirectional encoder. Its mask is the padding mask only "
                        "(an all-true GreaterOrEqual, not a band); nothing to lower.",
    "nanogpt_ts.onnx": "Stored 1x1x64x64 tril buffer (float 0/1), Slice to [:T,:T], Equal 0, Where -inf.",
    "nanogpt_dynamo.onnx": "Stored 1x1x64x64 tril buffer (float 0/1), Slice to [:T,:T], Equal 0, Where -inf.",
    "nanogpt_static16_ts.onnx": "Static T=16: the slice+Equal is constant-folded into a stored bool 1x1x16x16 initializer.",
    "nanogpt_static16_dynamo.onnx": "Static T=16: the slice+Equal is constant-folded into a stored bool 1x1x16x16 initializer.",
    "trilu_offsets_ts.onnx": "Four Trilu nodes: two on the input (k=1 upper, k=2 lower) and two on generated "
                             "ones/full tensors (k=-2 lower, k=3 upper); non-square (cols = rows + 3 in the checks). "
                             "Mul(x, tril(ones,-2)) is a band application that is not bit-exact.",
    "trilu_offsets_dynamo.onnx": "Four Trilu nodes: two on the input (k=1 upper, k=2 lower) and two on generated "
                                 "ones/full tensors (k=-2 lower, k=3 upper); non-square (cols = rows + 3 in the checks). "
                                 "Mul(x, tril(ones,-2)) is a band application that is not bit-exact.",
    "band_w2_ts.onnx": "Local attention |j-i| <= 2 from Range/Sub/Abs/LessOrEqual; Not gives the inverted band "
                       "that masked_fill writes -inf on.",
    "band_w2_dynamo.onnx": "Local attention |j-i| <= 2 from Range/Sub/Abs/LessOrEqual; Not gives the inverted band "
                           "that masked_fill writes -inf on.",
    "eye_dynamic_ts.onnx": "torch.eye(n) exports as EyeLike on a ConstantOfShape [n, n].",
    "eye_dynamic_dynamo.onnx": "torch.eye(n) exports as Equal(Range, Unsqueeze(Range)) then Cast to float.",
    "eye_static8_ts.onnx": "Static: eye(8)*3 and eye(8) are folded into Constant nodes.",
    "eye_static8_dynamo.onnx": "Static: eye(8)*3 and eye(8) are folded into initializers.",
    "torch_transformer_decoder_dynamo.onnx": "generate_square_subsequent_mask = Trilu(full(-inf), k=1) at run time; "
                                             "Add into the self-attention scores.",
    "torch_transformer_decoder_static8_ts.onnx": "TorchScript export is static (the dynamic one bakes tgt_len into a "
                                                 "Reshape); the Trilu on ConstantOfShape(-inf) is still a node, not folded.",
    "const_causal256_ts.onnx": "Stored 256x256 float32 buffer: -10000 above the diagonal, 0 elsewhere, Add into "
                               "the scores (Add of -10000 is not a DIAGONAL_MATRIX1 application: values are x-10000).",
    "const_causal256_dynamo.onnx": "Stored 256x256 float32 buffer: -10000 above the diagonal, 0 elsewhere, Add into "
                                   "the scores (Add of -10000 is not a DIAGONAL_MATRIX1 application: values are x-10000).",
    "folded_causal64_ts.onnx": "triu(full(-inf),1) at static T=64 folded into a 64x64 Constant node; Add into scores.",
    "folded_causal64_dynamo.onnx": "triu(full(-inf),1) at static T=64 folded into a 64x64 initializer; Add into scores.",
}


def write():
    log = {e["file"]: e for e in json.load(open(os.path.join(HERE, "export_log.json")))}
    models = []
    for fname in sorted(log):
        e = log[fname]
        path = os.path.join(HERE, fname)
        if not e.get("ok") or not os.path.exists(path):
            continue
        model = onnx.load(path)
        found = discover(path)
        ins = _inputs_meta(model)
        dyn = sorted({d for v in ins.values() for d in v["shape"] if isinstance(d, str)})
        models.append({
            "file": fname, "source": e["source"], "exporter": e["exporter"],
            "opset": [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")][0],
            "ir_version": model.ir_version, "bytes": os.path.getsize(path),
            "dynamic_axes": dyn, "inputs": ins,
            "masks": [to_entry(f) for f in select(found)],
            "other_band_tensors": [f["name"] for f in found if f not in select(found)],
            "notes": NOTES.get(fname, ""),
        })
        print(f"{fname}: {len(models[-1]['masks'])} masks")
    with open(os.path.join(HERE, "expected.json"), "w") as f:
        json.dump({"format": "see models/README.md", "int32_min": INT32_MIN, "int32_max": INT32_MAX,
                   "models": models}, f, indent=1)
        f.write("\n")


def check() -> int:
    exp = json.load(open(os.path.join(HERE, "expected.json")))
    bad = 0
    for m in exp["models"]:
        found = {f["name"]: to_entry(f) for f in discover(os.path.join(HERE, m["file"]))}
        for want in m["masks"]:
            got = found.get(want["onnx_nodes_or_initializer"])
            keys = ("kind", "begin", "end", "value", "other", "dtype", "exact")
            if got is None or any(got[k] != want[k] for k in keys):
                bad += 1
                print(f"MISMATCH {m['file']} {want['onnx_nodes_or_initializer']}: want {want}, got {got}")
        print(f"{m['file']}: {len(m['masks'])} masks checked")
    print("OK" if not bad else f"{bad} mismatches")
    return 1 if bad else 0


# --------------------------------------------------------------------------------------------
# symbolic Begin/End: the KV-cache corpus (models/kv_export_log.json)
# --------------------------------------------------------------------------------------------

TOTAL = "past_sequence + sequence"
# (sequence, past_sequence) sizes the fit samples: sequence >= 6 keeps a window of 4 and the causal
# edge inside the [sequence, past + sequence] slice, so neither side collapses to MIN/MAX.
SYMBOLIC_SIZES = ((6, 3), (7, 5), (9, 4), (6, 8), (8, 0), (10, 2))
# The padded run (first row's attention_mask starts with two zeros) must put the padded keys inside a
# window of 4, or a sliding-window mask combined with padding would look like a pure band.
PADDED_SIZE = (7, 1)


def symbolic_feeds(model: onnx.ModelProto, seq: int, past: int, seed: int, pad: bool) -> dict:
    """Feeds for a model whose inputs use the dims batch, sequence, past_sequence and their sum."""
    sizes = {"batch": 2, "sequence": seq, "past_sequence": past, TOTAL: past + seq, "encoder_sequence": 5}

    def mask(name: str, a: np.ndarray) -> np.ndarray | None:
        if not name.endswith("attention_mask"):
            return None
        if pad and name == "attention_mask":
            a[0, :2] = 0  # left padding in the first row
        return a

    return random_feeds(model, lambda d: d.dim_value if d.dim_value else sizes[d.dim_param], seed, mask)


def _fit_affine(points: list[tuple[int, int, int]]) -> tuple[int, int, int] | None:
    """Integer (a, b, c) with a*seq + b*past + c == v at every (seq, past, v), or None."""
    m = np.array([[s, p, 1] for s, p, _ in points], np.float64)
    v = np.array([x for _, _, x in points], np.float64)
    coef = np.rint(np.linalg.lstsq(m, v, rcond=None)[0]).astype(np.int64)
    if not np.array_equal(m.astype(np.int64) @ coef, v.astype(np.int64)):
        return None
    return int(coef[0]), int(coef[1]), int(coef[2])


def expression(coef: tuple[int, int, int]) -> str:
    """a*sequence + b*past_sequence + c as a short string, e.g. 'past_sequence + 1'."""
    terms = []
    for k, dim in zip(coef[:2], ("sequence", "past_sequence")):
        if k:
            terms.append((k, dim if abs(k) == 1 else f"{abs(k)}*{dim}"))
    if coef[2] or not terms:
        terms.append((coef[2], str(abs(coef[2]))))
    out = ("-" if terms[0][0] < 0 else "") + terms[0][1]
    for k, t in terms[1:]:
        out += f" {'-' if k < 0 else '+'} {t}"
    return out


def _side(points: list[tuple[int, int, int]], whole: int) -> str | None:
    """One side of the band over the sampled sizes: MIN/MAX, or an affine expression of the dims."""
    if all(v == whole for _, _, v in points):
        return "MIN" if whole == INT32_MIN else "MAX"
    if any(v in (INT32_MIN, INT32_MAX) for _, _, v in points):
        return None
    coef = _fit_affine(points)
    return None if coef is None else expression(coef)


def evaluate(expr: str, seq: int, past: int) -> int:
    """The value of a Begin/End expression at sizes (MIN/MAX are the int32 limits)."""
    if expr in ("MIN", "MAX"):
        return INT32_MIN if expr == "MIN" else INT32_MAX
    env = {"sequence": seq, "past_sequence": past}
    total, sign = 0, 1
    for tok in expr.replace("-", " - ").split():
        if tok in "+-":
            sign = -1 if tok == "-" else 1
            continue
        k, _, term = tok.rpartition("*")
        total += sign * (int(k) if k else 1) * (env[term] if term in env else int(term))
    return total


def canonical(begin: int, end: int, h: int, w: int) -> tuple[int, int]:
    """Begin/End as the fits write them: a side that covers every diagonal of [h, w] is MIN/MAX."""
    if begin < end or begin == INT32_MIN or end == INT32_MAX:
        begin = INT32_MIN if begin <= -(h - 1) else begin
        end = INT32_MAX if end > w - 1 else end
    return begin, end


def _value_deps(model: onnx.ModelProto) -> dict[str, frozenset]:
    """Graph inputs each tensor depends on through values (a Shape/Size output depends on none)."""
    inits = {i.name for i in model.graph.initializer}
    deps: dict[str, frozenset] = {i.name: frozenset([i.name]) for i in model.graph.input if i.name not in inits}
    for n in model.graph.node:
        d = frozenset() if n.op_type in ("Shape", "Size") else frozenset().union(
            *(deps.get(i, frozenset()) for i in n.input if i))
        for o in n.output:
            deps[o] = d
    return deps


def _cone_ops(model: onnx.ModelProto, name: str) -> dict[str, int]:
    """Op types of the nodes that compute `name` (not looking through Shape/Size inputs)."""
    producers = {o: n for n in model.graph.node for o in n.output}
    seen, stack, ops = set(), [name], {}
    while stack:
        t = stack.pop()
        n = producers.get(t)
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
        if n.op_type not in ("Shape", "Size"):
            stack.extend(i for i in n.input if i)
    return dict(sorted(ops.items(), key=lambda kv: -kv[1]))


def _path_to_softmax(model: onnx.ModelProto, name: str) -> list[onnx.NodeProto]:
    """The shortest chain of nodes from `name` to the first Softmax it reaches (empty if none)."""
    consumers: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    parent: dict[int, tuple] = {}
    frontier = [(n, None) for n in consumers.get(name, [])]
    while frontier:
        nxt = []
        for n, prev in frontier:
            if id(n) in parent:
                continue
            parent[id(n)] = (n, prev)
            if n.op_type == "Softmax":
                path = []
                cur = (n, prev)
                while cur is not None:
                    path.append(cur[0])
                    cur = parent[id(cur[1])] if cur[1] is not None else None
                return path[::-1]
            nxt += [(c, n) for o in n.output for c in consumers.get(o, [])]
        frontier = nxt
    return []


def _sites(model: onnx.ModelProto, name: str, deps: dict[str, frozenset]) -> dict:
    """Which node combines the band with the padding mask and which applies it to the scores."""
    path = _path_to_softmax(model, name)
    combined, applied = None, None
    on_path = {name}
    for n in path:
        others = [i for i in n.input if i and i not in on_path]
        dep = frozenset().union(*(deps.get(i, frozenset()) for i in others))
        if combined is None and dep and all(d.endswith("attention_mask") for d in dep):
            combined = f"{n.op_type} {n.name}"
        elif applied is None and any(not d.endswith("attention_mask") for d in dep):
            applied = f"{n.op_type} {n.name}"
        on_path.update(o for o in n.output if o)
    return {"combined_with_padding_by": combined, "applied_by": applied,
            "path_to_softmax": [n.op_type for n in path]}


def discover_symbolic(path: str) -> list[dict]:
    """Band tensors of a model with sequence/past dims, Begin/End fitted as expressions."""
    model = onnx.load(path)
    has_past = any(d.dim_param == "past_sequence" for i in model.graph.input for d in i.type.tensor_type.shape.dim)
    sizes = SYMBOLIC_SIZES if has_past else tuple((s, 0) for s in (6, 7, 9, 8, 10, 11))
    runs = [run_all(model, symbolic_feeds(model, s, p, k, False)) for k, (s, p) in enumerate(sizes)]
    pad_size = PADDED_SIZE if has_past else (PADDED_SIZE[0], 0)
    padded = run_all(model, symbolic_feeds(model, *pad_size, 99, True))
    producers = {o: n for n in model.graph.node for o in n.output}
    inits = {i.name for i in model.graph.initializer}
    consumers: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)

    def fit_all(fit: Callable[..., dict | None], *names: str) -> dict | None:
        fits = []
        for r in runs + [padded]:
            if any(n not in r for n in names):
                return None
            f = fit(*(np.asarray(r[n]) for n in names))
            if f is None:
                return None
            fits.append(f)
        keys = ("value", "other", "dtype")
        if any(_jsonval(f[k]) != _jsonval(fits[0][k]) for f in fits for k in keys):
            return None
        # the padded run is checked below, not fitted: at its size a side may cover the whole slice
        begin = _side([(s, p, f["begin"]) for (s, p), f in zip(sizes, fits)], INT32_MIN)
        end = _side([(s, p, f["end"]) for (s, p), f in zip(sizes, fits)], INT32_MAX)
        if begin is None or end is None:
            return None
        s, p = pad_size
        h, w = np.asarray(padded[names[0]]).shape[-2:]
        if (fits[-1]["begin"], fits[-1]["end"]) != canonical(evaluate(begin, s, p), evaluate(end, s, p), h, w):
            return None  # the padded run must be the same band
        return dict(fits[0], begin=begin, end=end)

    gens = {}
    for name in runs[0]:
        f = fit_all(fit_generator, name)
        if f:
            gens[name] = f
    apps = {}
    for n in model.graph.node:
        if not n.output or n.output[0] in gens:
            continue
        for x in n.input:
            if x and x not in gens:
                f = fit_all(fit_application, n.output[0], x)
                if f:
                    apps[n.output[0]] = dict(f, data_input=x)
                    break
    deps = _value_deps(model)
    out = []
    for name, f in list(gens.items()) + list(apps.items()):
        prod = producers.get(name)
        if name in apps:
            kind = "trilu" if prod.op_type == "Trilu" else "mask_application"
        elif name in inits or (prod is not None and prod.op_type == "Constant"):
            kind = "stored_mask"
        else:
            kind = {"Trilu": "trilu", "EyeLike": "eyelike"}.get(prod.op_type if prod else "", "mask_subgraph")
        cons = consumers.get(name, [])
        frontier = name in apps or (not cons) or any(any(o not in gens for o in c.output if o) for c in cons)
        s, p = sizes[1]
        out.append(dict(f, name=name, kind=kind, frontier=frontier, shape=list(np.asarray(runs[1][name]).shape),
                        shape_at={"sequence": s, "past_sequence": p} if has_past else {"sequence": s},
                        node=prod.name if prod is not None else None,
                        op_type=prod.op_type if prod is not None else "initializer",
                        cone_ops=_cone_ops(model, name), **_sites(model, name, deps)))
        if name in apps:
            out[-1]["applied_by"] = f"{prod.op_type} {prod.name}"
    return out


def describe_symbolic(f: dict) -> str:
    v, o = _jsonval(f["value"]), _jsonval(f["other"])
    b, e = f["begin"], f["end"]
    cond = " and ".join(c for c in ((f"x-y >= {b}" if b != "MIN" else ""), (f"x-y < {e}" if e != "MAX" else "")) if c)
    return f"{v} where {cond or 'everywhere'}, else {'input' if o == 'input' else o}"


def to_symbolic_entry(f: dict) -> dict:
    e = to_entry(dict(f, begin=0, end=1))
    del e["shape_at_len7"]
    e.update(begin=f["begin"], end=f["end"], shape=f["shape"], shape_at=f["shape_at"],
             semantics=describe_symbolic(f), combined_with_padding_by=f["combined_with_padding_by"],
             applied_by=f["applied_by"], path_to_softmax=f["path_to_softmax"], cone_ops=f["cone_ops"])
    return e


def symbolic_entries() -> list[dict]:
    log = json.load(open(os.path.join(HERE, "kv_export_log.json")))
    models = []
    for e in sorted(log, key=lambda e: e["file"]):
        path = os.path.join(HERE, e["file"])
        if not e.get("ok") or not os.path.exists(path):
            continue
        model = onnx.load(path)
        found = discover_symbolic(path)
        ins = _inputs_meta(model)
        models.append({
            "file": e["file"], "source": e["source"], "exporter": e["exporter"],
            "opset": [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")][0],
            "ir_version": model.ir_version, "bytes": os.path.getsize(path),
            "dynamic_axes": sorted({d for v in ins.values() for d in v["shape"] if isinstance(d, str)}),
            "inputs": ins, "outputs": [o.name for o in model.graph.output],
            "input_sets": {s: f"inputs/{e['name']}/{s}.npz" for s in e.get("input_sets", [])},
            "masks": [to_symbolic_entry(f) for f in select(found)],
            "other_band_tensors": [f["name"] for f in found if f not in select(found)],
            "notes": SYMBOLIC_NOTES.get(e["name"].rsplit("_", 1)[0], ""),
        })
        print(f"{e['file']}: {len(models[-1]['masks'])} masks")
    return models


def write_symbolic() -> None:
    """Regenerate expected.json's `symbolic_models` list, keeping the rest of the file."""
    p = os.path.join(HERE, "expected.json")
    exp = json.load(open(p))
    exp["symbolic_models"] = symbolic_entries()
    exp["symbolic_format"] = SYMBOLIC_FORMAT
    with open(p, "w") as f:
        json.dump(exp, f, indent=1)
        f.write("\n")


def check_symbolic() -> int:
    exp = json.load(open(os.path.join(HERE, "expected.json")))
    bad = 0
    for m in exp.get("symbolic_models", []):
        found = {f["name"]: to_symbolic_entry(f) for f in discover_symbolic(os.path.join(HERE, m["file"]))}
        for want in m["masks"]:
            got = found.get(want["onnx_nodes_or_initializer"])
            keys = ("kind", "begin", "end", "value", "other", "dtype", "exact", "applied_by")
            if got is None or any(got[k] != want[k] for k in keys):
                bad += 1
                print(f"MISMATCH {m['file']} {want['onnx_nodes_or_initializer']}: want {want}, got {got}")
        print(f"{m['file']}: {len(m['masks'])} masks checked")
    print("OK" if not bad else f"{bad} mismatches")
    return 1 if bad else 0


SYMBOLIC_FORMAT = (
    "symbolic_models: models whose masks depend on the dims (KV cache, sliced/concatenated masks). Entries "
    "as in `models`, except begin/end are strings: MIN, MAX or an integer expression of the input dims "
    "'sequence' and 'past_sequence' (e.g. 'past_sequence + 1'), fitted exactly over several sizes; `shape` is "
    "the tensor's shape at `shape_at`; combined_with_padding_by / applied_by name the node on the way to the "
    "Softmax that And/Mul/Where-s it with the attention_mask-derived tensor and the one that applies it to the "
    "scores; cone_ops counts the op types computing the tensor; input_sets lists the saved feeds.")

_KV = ("transformers masking_utils builds the mask once per layer type at run time from cache_position "
       "(past_sequence + Range) and the key length; the causal keep-mask is End = past_sequence + 1.")
SYMBOLIC_NOTES = {
    "gpt2_kv": _KV, "llama_kv": _KV, "phi3_kv": _KV, "gpt_neox_kv": _KV,
    "mistral_sw4_kv": _KV + " Sliding window 4: Begin = past_sequence - 3.",
    "qwen2_mixed_sw4_kv": _KV + " Layer 0 full causal, layer 1 sliding window 4 (Begin = past_sequence - 3).",
    "gemma2_sw4_kv": _KV + " Alternating sliding (window 4) and full layers.",
    "opt_kv": _KV + " Positions come from a CumSum of attention_mask (not a mask site).",
    "bloom_kv": _KV + " The alibi bias comes from a CumSum of attention_mask (not a band).",
    "t5_decoder_kv": _KV + " Relative-position buckets (Log/Min/Where on j - i) give a Toeplitz bias, not a band.",
    "clip_text": "CLIP text model: causal mask built by masking_utils without a cache (End = 1), plus padding.",
    "sliced_double_causal": "Causal keep-mask built for 2*T (Range/LessOrEqual), Sliced to [:T, :T].",
    "split_concat_tril": "Stored 64x64 bool tril Split in row halves, Concat, Sliced to [:T, :T].",
    "concat_causal_halves": "Two row blocks of the causal mask (Range/LessOrEqual each) Concatenated.",
    "stored_tril_past": "Stored 1x1x64x64 bool tril Sliced [past:past+seq, :past+seq] (GPT-2 4.x style).",
    "concat_past_zeros": "transformers 4.3x _make_causal_mask: Concat(zeros [seq, past], finfo.min/0 causal square "
                         "from Range/Less/Where), Added to the scores (x + finfo.min == finfo.min for these x).",
    "trilu_past": "Trilu(full([seq, past+seq], finfo.min), k = past + 1): k computed from the shapes; Added.",
}


def main(argv):
    cmd = argv[1] if len(argv) > 1 else "check"
    if cmd == "discover":
        for p in argv[2:]:
            print(p)
            for f in discover(p):
                print("  ", "*" if f in select([f]) else " ", to_entry(f))
    elif cmd == "discover-symbolic":
        for p in argv[2:]:
            print(p)
            for f in discover_symbolic(p):
                print("  ", "*" if f in select([f]) else " ", to_symbolic_entry(f))
    elif cmd == "write":
        write()
        write_symbolic()
    elif cmd == "write-symbolic":
        write_symbolic()
    elif cmd == "check":
        return check() | check_symbolic()
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
