"""Build HELD-OUT round 7: models written by tools rounds 1-6 did not use.

    /work/scratch/torchvenv/bin/python models/scripts/make_heldout7.py genai [--out DIR] [WANT ...]
    /work/scratch/torchvenv/bin/python models/scripts/make_heldout7.py torch [--out DIR] [WANT ...]
    /work/scratch/torchvenv/bin/python models/scripts/make_heldout7.py variants [--out DIR] [WANT ...]

torch 2.13 / transformers 5.23 / onnxscript 0.7.2 / onnxruntime 1.32.0, onnxruntime-genai 0.18.0,
onnxsim 0.8.1, onnxslim 0.1.98, onnxconverter-common 1.16.0; random weights, configs in code (no
weights downloaded), 2 layers, hidden 32, vocab 100, windows of 4.

`genai`: onnxruntime-genai's model builder (`python -m onnxruntime_genai.models.builder -i DIR -m
NAME`) on a tiny random transformers model saved with save_pretrained next to a 100-token WordLevel
tokenizer (the builder saves the tokenizer too, and refuses a folder without one), at several
execution providers and precisions: the builder writes per (EP, precision) a different attention:
GroupQueryAttention (its mask is `seqlens_k` from a ReduceSum of attention_mask, its window an
attribute), MultiHeadAttention fed by a 4D causal mask it builds from Range / Less / Where / Equal /
Expand ("attention mask reformatting"; cpu fp16), or packed Attention (dml fp32). Families llama,
qwen2, qwen3, phi3, gemma2 (sliding 4 / full), gemma3 (sliding 4 / full), mistral (sliding 4).
The weights stay in the builder's external data file (model.onnx.data, renamed with the model).
Sets from the model's own inputs: prefill (past 0, seq 4), prefill_past (past 5, seq 3), decode (past
7, seq 1), left_padded (batch 2, past 0, seq 5, two zeros on the left of row 0), left_padded_decode
(batch 2, past 4, seq 1, the same zeros), long (batch 2, seq 40, six zeros): GroupQueryAttention
takes a batch above 1 with a past only at seq 1.

`torch`: llama (KV), mistral sliding 4 (KV), gemma3 sliding 4 / full (KV) and a BERT encoder through
TorchScript (opset 17) and the dynamo exporter (opset 18), make_heldout4's `export_jobs` (verified
against torch at every set, rtol / atol 1e-4).

`variants` of the `torch` exports (each keeps its source's sets): onnxsim `simplify` (dynamic
shapes kept: `_sim`), onnxsim with every input shape fixed to the prefill_past / seq9 set's
(`_simstatic`: the masks fold to stored constants; that set, and it with the first row's first
three positions padded), onnxslim `slim` (`_slim`),
onnxconverter-common float16 with keep_io_types of the simplified exports (`_fp16`), onnxruntime
quantize_static QDQ calibrated on the sets (`_qdq`), and onnxruntime's offline-optimized model
(SessionOptions.optimized_model_filepath at ORT_ENABLE_BASIC `_ortbasic` and ORT_ENABLE_EXTENDED
`_ortext`, CPU provider: the latter holds com.microsoft ops).

Tool failures are logged in DIR/heldout_log.json (why: docs/heldout.md, Round 7). Input sets are
saved as DIR/inputs/<model>/<set>.npz, so models/scripts/heldout_report.py DIR measures them.
The files stay out of git (out/ is ignored).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
import warnings

import numpy as np
import onnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "..", "out", "heldout7")
VOCAB = 100
HYBRID = ["sliding_attention", "full_attention"]
SMALL = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, max_position_embeddings=256, pad_token_id=0, bos_token_id=0, eos_token_id=0)


def _log(log: list[dict], entry: dict) -> None:
    log[:] = [e for e in log if e["name"] != entry["name"]] + [entry]


def _fail(entry: dict, e: BaseException) -> None:
    msg = str(e).strip().splitlines()
    entry.update(ok=False, error=f"{type(e).__name__}: {msg[-1][:400] if msg else ''}")
    print(f"FAIL {entry['name']}: {entry['error']}", flush=True)


# ---- the model builder of onnxruntime-genai -----------------------------------------------------
FAMILIES = {  # name: (transformers model, config, extra config)
    "llama": ("LlamaForCausalLM", "LlamaConfig", dict(head_dim=16)),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", {}),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(head_dim=16)),
    "phi3": ("Phi3ForCausalLM", "Phi3Config", dict(original_max_position_embeddings=256)),  # (else LongRoPE)
    "gemma2_sw4": ("Gemma2ForCausalLM", "Gemma2Config", dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=4,
                                                             layer_types=HYBRID)),
    "gemma3_sw4": ("Gemma3ForCausalLM", "Gemma3TextConfig", dict(head_dim=16, query_pre_attn_scalar=16,
                                                                 sliding_window=4, layer_types=HYBRID)),
    "mistral_sw4": ("MistralForCausalLM", "MistralConfig", dict(head_dim=16, sliding_window=4)),
}
# (EP, precision) per family: every family at the three that differ most, three families at all
COMBOS = [("cpu", "fp32"), ("cpu", "fp16"), ("dml", "fp16")]
MORE = [("cpu", "int4"), ("dml", "fp32"), ("dml", "int4"), ("webgpu", "fp32"), ("webgpu", "fp16")]
ALL_COMBOS = ("llama", "qwen3", "gemma3_sw4")


def _tokenizer(folder: str) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    t = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=t, unk_token="t0", pad_token="t0", bos_token="t0",
                            eos_token="t0").save_pretrained(folder)


def _dims(vi: onnx.ValueInfoProto) -> list:
    return [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]


# (name, batch, past, seq, zeros on the left of row 0): GroupQueryAttention refuses a batch above 1
# with a past and seq > 1 ("batch_size must be 1 when sequence_length > 1 and past context is
# given"), so the padded batches are a prefill and a decode step
GENAI_SETS = (("prefill", 1, 0, 4, 0), ("prefill_past", 1, 5, 3, 0), ("decode", 1, 7, 1, 0),
              ("left_padded", 2, 0, 5, 2), ("left_padded_decode", 2, 4, 1, 2), ("long", 2, 0, 40, 6))


def genai_feeds(path: str, head_dim: int) -> dict[str, dict[str, np.ndarray]]:
    """The KV sets from the model's own inputs (names, dtypes, fixed dims; the builder names the
    head dim `kv_cache_dim`)."""
    from onnx.helper import tensor_dtype_to_np_dtype
    m = onnx.load(path, load_external_data=False)
    sets = {}
    for name, b, past, seq, pad in GENAI_SETS:
        rng = np.random.default_rng(100 * past + 10 * seq + b)
        mask = np.ones((b, past + seq), np.int64)
        mask[0, :pad] = 0
        feeds = {}
        for i in m.graph.input:
            dt = tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
            if i.name == "input_ids":
                feeds[i.name] = rng.integers(1, VOCAB, (b, seq)).astype(dt)
            elif i.name == "attention_mask":
                feeds[i.name] = mask.astype(dt)
            elif i.name == "position_ids":
                pos = np.clip(np.cumsum(mask, -1) - 1, 0, None)
                feeds[i.name] = pos[:, past:].astype(dt)
            elif i.name.startswith("past_key_values"):
                d = _dims(i)
                feeds[i.name] = rng.standard_normal(
                    (b, d[1], past, d[3] if isinstance(d[3], int) else head_dim)).astype(dt)
            else:
                raise ValueError(f"no set for input {i.name} {_dims(i)}")
        sets[name] = feeds
    return sets


def _save_sets(sets: dict[str, dict[str, np.ndarray]], folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    for set_name, feeds in sets.items():
        np.savez_compressed(os.path.join(folder, set_name + ".npz"), **feeds)


def genai_part(out: str, want: list[str], log: list[dict]) -> None:
    import torch
    import transformers as tf
    jobs = [(fam, ep, p) for fam in FAMILIES for ep, p in COMBOS + (MORE if fam in ALL_COMBOS else [])]
    with tempfile.TemporaryDirectory() as tmp:
        for fam, ep, precision in jobs:
            name = f"genai_{fam}_{ep}_{precision}"
            if want and not any(w in name for w in want):
                continue
            model, config, extra = FAMILIES[fam]
            entry = {"name": name, "file": name + ".onnx",
                     "source": f"onnxruntime-genai builder -e {ep} -p {precision} of a tiny random "
                               f"transformers {model}"}
            src = os.path.join(tmp, fam)
            try:
                if not os.path.exists(src):
                    torch.manual_seed(0)
                    getattr(tf, model)(getattr(tf, config)(**{**SMALL, **extra})).save_pretrained(src)
                    _tokenizer(src)
                dst = os.path.join(tmp, name)
                p = subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", src, "-m", fam,
                                    "-o", dst, "-p", precision, "-e", ep, "-c", os.path.join(tmp, "cache")],
                                   capture_output=True, text=True)
                if p.returncode or not os.path.exists(os.path.join(dst, "model.onnx")):
                    raise RuntimeError(f"builder exit {p.returncode}: {(p.stderr or p.stdout).strip()[-400:]}")
                # one file (the weights are small): the builder's external data folded in
                m = onnx.load(os.path.join(dst, "model.onnx"))
                path = os.path.join(out, name + ".onnx")
                onnx.save(m, path)
                entry["ops"] = sorted({n.op_type for n in m.graph.node if n.domain == "com.microsoft"
                                       or n.op_type in ("Range", "Less", "Trilu", "Where")})
                with open(os.path.join(src, "config.json")) as f:
                    c = json.load(f)
                sets = genai_feeds(path, c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])
                import onnxruntime as ort
                try:
                    ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, sets["prefill_past"])
                except Exception as e:  # noqa: BLE001 (recorded: the report counts the sets it refuses)
                    entry["ort_note"] = f"{type(e).__name__}: {str(e).strip()[:300]}"
                _save_sets(sets, os.path.join(out, "inputs", name))
                entry.update(ok=True, bytes=os.path.getsize(path), input_sets=sorted(sets))
                print(f"OK   {name}: {entry['bytes']} bytes, {entry['ops']}", flush=True)
            except Exception as e:  # noqa: BLE001 (recorded, not hidden)
                _fail(entry, e)
            _log(log, entry)


# ---- torch exports -------------------------------------------------------------------------------
def torch_part(out: str, want: list[str], log: list[dict]) -> None:
    import make_heldout as h1
    import make_heldout4 as h4
    import transformers as tf
    from make_kv_models import Spec

    def build(model: str, config: str, **kw: object):  # type: ignore[no-untyped-def]
        return lambda: getattr(tf, model)(getattr(tf, config)(**{**SMALL, "attn_implementation": "eager", **kw}))

    hf = "transformers {} (tiny random config, eager attention){}"
    kvs = ", flat KV cache through DynamicCache"
    specs = [
        Spec("llama_kv", hf.format("LlamaForCausalLM", kvs), build("LlamaForCausalLM", "LlamaConfig"), "decoder"),
        Spec("mistral_sw4_kv", hf.format("MistralForCausalLM sliding 4", kvs),
             build("MistralForCausalLM", "MistralConfig", sliding_window=4), "decoder"),
        Spec("gemma3_sw4_kv", hf.format("Gemma3ForCausalLM sliding 4 / full", kvs),
             build("Gemma3ForCausalLM", "Gemma3TextConfig", head_dim=16, query_pre_attn_scalar=16, sliding_window=4,
                   layer_types=HYBRID), "decoder"),
        Spec("bert", hf.format("BertModel encoder", ", padding mask"),
             lambda: tf.BertModel(tf.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                                num_attention_heads=2, intermediate_size=64,
                                                max_position_embeddings=128, attn_implementation="eager"),
                                  add_pooling_layer=False), "encoder"),
    ]
    jobs = [(s, suffix, e) for s in specs for suffix, e in (("ts", "torchscript"), ("dynamo", "dynamo"))]

    def prepare(spec: Spec):  # type: ignore[no-untyped-def]
        module = h1.prepare(spec)
        if spec.kind == "encoder":  # (make_kv_models' three sets plus one left-padded and a long one)
            rng = np.random.default_rng(5)
            for name, b, t, pad in (("left_padded", 2, 8, 3), ("long", 1, 64, 0)):
                mask = np.ones((b, t), np.int64)
                mask[0, :pad] = 0
                spec.sets[name] = {"input_ids": rng.integers(1, VOCAB, (b, t)).astype(np.int64),
                                   "attention_mask": mask}
        return module

    h4.export_jobs(jobs, prepare, out, want, log)


# ---- the variants ----------------------------------------------------------------------------------
def _sim(a: str, b: str, sets: str) -> None:
    import onnxsim
    m, ok = onnxsim.simplify(onnx.load(a))
    if not ok:
        raise RuntimeError("onnxsim: the simplified model differs from the original at its check")
    onnx.save(m, b)


def _static_set(sets: str) -> str:
    names = os.listdir(sets)
    return "prefill_past.npz" if "prefill_past.npz" in names else "seq9.npz"


def _simstatic(a: str, b: str, sets: str) -> None:
    """onnxsim with every input's shape fixed to one set's: the shape cones fold, masks included."""
    import onnxsim
    feeds = dict(np.load(os.path.join(sets, _static_set(sets))))
    m, ok = onnxsim.simplify(onnx.load(a), overwrite_input_shapes={k: list(v.shape) for k, v in feeds.items()})
    if not ok:
        raise RuntimeError("onnxsim: the simplified model differs from the original at its check")
    onnx.save(m, b)


def _slim(a: str, b: str, sets: str) -> None:
    import onnxslim
    onnx.save(onnxslim.slim(onnx.load(a)), b)


def _fp16(a: str, b: str, sets: str) -> None:
    from onnxconverter_common import float16
    onnx.save(float16.convert_float_to_float16(onnx.load(a), keep_io_types=True), b)


def _qdq(a: str, b: str, sets: str) -> None:
    from make_heldout3 import calibration_reader
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    quantize_static(a, b, calibration_reader(sets), quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Gemm"])
    m = onnx.load(b)
    m.ir_version = min(m.ir_version, 10)
    onnx.save(m, b)


def _ortopt(level: str):  # type: ignore[no-untyped-def]
    def run(a: str, b: str, sets: str) -> None:
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        so.optimized_model_filepath = b
        ort.InferenceSession(a, so, providers=["CPUExecutionProvider"])
    return run


def _static_sets(name: str, out: str, source: str) -> None:
    """A fixed-shape variant keeps its source's one set of those shapes, and the same set with the
    first row's first three positions padded (`_padded`: the folded mask and attention_mask meet)."""
    src = os.path.join(out, "inputs", source)
    dst = os.path.join(out, "inputs", name)
    os.makedirs(dst, exist_ok=True)
    first = _static_set(src)
    shutil.copy(os.path.join(src, first), dst)
    feeds = dict(np.load(os.path.join(src, first)))
    feeds["attention_mask"] = feeds["attention_mask"].copy()
    feeds["attention_mask"][0, :3] = 0
    np.savez_compressed(os.path.join(dst, first[:-4] + "_padded.npz"), **feeds)


DECODERS = ("llama_kv_ts", "llama_kv_dynamo", "mistral_sw4_kv_ts", "mistral_sw4_kv_dynamo", "gemma3_sw4_kv_ts",
            "gemma3_sw4_kv_dynamo")
# (suffix, what it is, converter, sources)
VARIANTS = [
    ("sim", "onnxsim simplify (dynamic shapes)", _sim, (*DECODERS, "bert_ts", "bert_dynamo")),
    ("slim", "onnxslim slim", _slim, (*DECODERS, "bert_ts", "bert_dynamo")),
    ("simstatic", "onnxsim simplify, every input shape fixed to one set's", _simstatic,
     ("llama_kv_ts", "mistral_sw4_kv_dynamo", "gemma3_sw4_kv_ts", "bert_ts", "bert_dynamo")),
    ("fp16", "onnxconverter-common float16 (keep_io_types)", _fp16,
     ("llama_kv_ts_sim", "mistral_sw4_kv_dynamo_slim", "gemma3_sw4_kv_ts_sim", "bert_ts_sim", "llama_kv_ts")),
    ("qdq", "onnxruntime quantize_static QDQ (MatMul/Gemm, u8/s8, calibrated on the sets)", _qdq,
     ("llama_kv_ts_sim", "mistral_sw4_kv_dynamo", "bert_dynamo")),
    ("ortbasic", "onnxruntime optimized_model_filepath, ORT_ENABLE_BASIC (CPU)", _ortopt("ORT_ENABLE_BASIC"),
     ("llama_kv_ts", "mistral_sw4_kv_dynamo", "gemma3_sw4_kv_ts", "bert_ts", "bert_dynamo")),
    ("ortext", "onnxruntime optimized_model_filepath, ORT_ENABLE_EXTENDED (CPU)", _ortopt("ORT_ENABLE_EXTENDED"),
     ("llama_kv_ts", "mistral_sw4_kv_dynamo", "gemma3_sw4_kv_ts", "bert_ts", "bert_dynamo")),
]


def variants_part(out: str, want: list[str], log: list[dict]) -> None:
    for suffix, how, convert, sources in VARIANTS:
        for source in sources:
            name = f"{source}_{suffix}"
            if want and not any(w in name for w in want):
                continue
            if not os.path.exists(os.path.join(out, source + ".onnx")):
                continue
            entry = {"name": name, "file": name + ".onnx", "source": f"{how} of {source}", "variant_of": source}
            path = os.path.join(out, name + ".onnx")
            try:
                convert(os.path.join(out, source + ".onnx"), path, os.path.join(out, "inputs", source))
                if suffix == "simstatic":
                    _static_sets(name, out, source)
                else:
                    shutil.copytree(os.path.join(out, "inputs", source), os.path.join(out, "inputs", name),
                                    dirs_exist_ok=True)
                m = onnx.load(path)
                entry.update(ok=True, bytes=os.path.getsize(path), nodes=len(m.graph.node),
                             contrib=sorted({n.op_type for n in m.graph.node if n.domain == "com.microsoft"}))
                import onnxruntime as ort
                so = ort.SessionOptions()
                so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
                try:
                    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
                    folder = os.path.join(out, "inputs", name)
                    feeds = dict(np.load(os.path.join(folder, sorted(os.listdir(folder))[0])))
                    s.run(None, {k: v for k, v in feeds.items() if k in {i.name for i in s.get_inputs()}})
                except Exception as e:  # noqa: BLE001 (recorded: the report counts the sets it refuses)
                    entry["ort_note"] = f"{type(e).__name__}: {str(e).strip()[:300]}"
                print(f"OK   {name}: {entry['bytes']} bytes, {entry['nodes']} nodes {entry.get('ort_note', '')[:120]}",
                      flush=True)
            except Exception as e:  # noqa: BLE001 (recorded, not hidden)
                if os.path.exists(path):
                    os.remove(path)
                _fail(entry, e)
                traceback.print_exc(limit=2)
            _log(log, entry)


def main(argv: list[str] | None = None) -> int:
    import make_heldout4 as h4
    return h4.run_parts(__doc__, DEFAULT_OUT, {"genai": genai_part, "torch": torch_part, "variants": variants_part},
                        argv)


if __name__ == "__main__":
    sys.exit(main())
