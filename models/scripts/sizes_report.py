"""Every size: dmlgraph's outputs against onnxruntime on the original over a grid of sizes.

Run (project venv, no torch):
    .venv/bin/python models/scripts/sizes_report.py [--extra | --round9 | --round10 | --round11] [--json FILE]
        [--only SUBSTR ...]
    .venv/bin/python models/scripts/sizes_report.py --rows --json FILE     (the table of a saved run)

Per model (MODELS, or EXTRA with --extra): `dmlgraph optimize` once on target dml, once on target
onnx and once on target onnx with `--exact`. Then input sets are generated from the model's own
input signature (roles read off the input and dim names, dtypes and fixed dims from a saved set) at
sizes aimed at the boundaries of a window W (4 for every model here): sequence S in {1, 2, 3, W,
W+1, 31, 64, 257} (1024 for LONG); for models with a KV cache 29 (S, P) pairs with past P in {0, 1,
W-1, W, W+1, 100, 2047}; batch 1 unpadded, batch 3 left-padded (right-padded for encoders), a batch
with one all-zero attention_mask row; one set whose float inputs hold -0.0, NaN and infinities;
off-claim probes (`make_set`); rows x cols pairs and odd sizes for the synthetic exports; for a
static cache (a `cache_position` input beside caches of a fixed length L) positions p..p+s-1 at 17
(S, P) pairs with P + S <= L and 2 past its end.
For each set the original runs in onnxruntime twice (if it refuses, or the second run differs, the
set counts as "original refuses" / "original unstable" and nothing else runs); the onnx outputs run
in onnxruntime and the dml output in dmlgraph's executor (reference kernels for the DML nodes), each
compared with the original's outputs: `exact` (bit for bit), `equal` (same shapes, NaN and inf at
the same places, finite values within rtol 1e-5 / atol 1e-6 as `dmlgraph.validate`, 1e-3 for
float16 outputs; a dml run outside that is passed to `dmlgraph.validate`, which runs the original
cut at the same sessions), `finite-only` (a mismatch on the non-finite set where mask_arith, equal
for finite data only, rewrote), `mismatch`, `refused` (the lowered model refuses a set the original
runs: a DmlgraphError or an onnxruntime error, e.g. a run-time dim guard) or `crash` (any other
exception). onnxruntime runs one thread, its graph optimizations off (as heldout_report.py).
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort

import dmlgraph
from dmlgraph import pipeline
from dmlgraph.errors import DmlgraphError
from dmlgraph.runtime.executor import Executor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
WINDOW = 4
RTOL, ATOL, RTOL16 = 1e-5, 1e-6, 1e-3

# (directory, model) pairs: decoders with a KV cache (sliding window, chunked, full causal), the same
# exports through onnxsim / onnxslim / onnxruntime's optimizer / float16 / int8 / QDQ / int4, Optimum's
# merged decoders, onnxruntime-genai's builder, encoders with padding, encoder-decoders, gpt2 with its
# stored 1024-position causal buffer.
# Each round's folder where its make_heldoutN.py writes it by default (`--dir KEY=PATH` elsewhere).
_D = {"m": os.path.join(ROOT, "models"), **{key: os.path.join(ROOT, "out", f"heldout{key[1:]}")
                                            for key in ("h2", "h4", "h6", "h6b", "h7", "h9", "h10", "h11")}}
MODELS = [
    ("m", "llama_kv_ts"), ("m", "mistral_sw4_kv_ts"), ("m", "mistral_sw4_kv_dynamo"), ("m", "gemma2_sw4_kv_ts"),
    ("m", "qwen2_mixed_sw4_kv_dynamo"), ("m", "qwen2_mixed_sw4_kv_ts"), ("m", "gpt2_kv_ts"), ("m", "gpt2_ts"),
    ("m", "gpt2_dynamo"), ("m", "bert_ts"), ("m", "t5_decoder_kv_ts"), ("m", "t5_decoder_kv_dynamo"),
    ("m", "opt_kv_dynamo"), ("m", "bloom_kv_ts"), ("m", "phi3_kv_dynamo"), ("m", "mistral_sw4_ts"),
    ("m", "stored_tril_past_ts"), ("m", "clip_text_ts"),
    ("h2", "opt_llama_merged"), ("h2", "opt_gpt2_merged"), ("h2", "opt_llama_model"),
    ("h4", "bert_ts_ortopt2"), ("h4", "bart_full_nocache_ts"), ("h4", "gemma3_sw4_nocache_fp16_ts"),
    ("h4", "mistral_sw4_sdpa_kv_dynamo23raw"), ("h4", "opt_whisper_with_past"),
    ("h6", "cohere2_sw4_kv_dynamo_int8"), ("h6", "gpt_oss_sw4_kv_ts_fp16"), ("h6", "llama4_chunk4_kv_ts"),
    ("h6", "ministral_sw4_kv_i32_ts"), ("h6", "qwen2_sw4_kv_dynamo_fp16"), ("h6", "exaone4_sw4_kv_ts"),
    ("h6b", "modernbert_lw4_encoder_ts"), ("h6b", "modernbert_lw4_fp16_encoder_dynamo"),
    ("h6b", "modernbert_decoder_lw4_kv_ts"), ("h6b", "t5gemma_sw4_decoder_kv_ts"),
    ("h6b", "roberta_encoder_ts_ortopt2"), ("h6b", "deberta_v2_encoder_ts"),
    ("h7", "genai_mistral_sw4_cpu_fp32"), ("h7", "genai_gemma2_sw4_cpu_fp16"), ("h7", "genai_llama_cpu_int4"),
    ("h7", "genai_qwen3_dml_fp16"), ("h7", "llama_kv_ts_sim_fp16"), ("h7", "mistral_sw4_kv_dynamo_slim"),
    ("h7", "mistral_sw4_kv_dynamo_qdq"), ("h7", "gemma3_sw4_kv_ts_ortext"), ("h7", "bert_ts_sim_fp16"),
    ("h7", "mistral_sw4_kv_ts_sim"),
    ("m", "gemma2_sw4_kv_dynamo"), ("m", "gpt_neox_kv_ts"), ("m", "gpt2_kv_dynamo"), ("m", "nanogpt_ts"),
    ("m", "concat_past_zeros_ts"), ("m", "trilu_past_ts"), ("m", "llama_dynamo"), ("h2", "opt_gpt2_decoder"),
    ("h4", "llama_sdpa_kv_ts"), ("h4", "sdpawindow_ts"), ("h4", "mistral_sw4_nocache_fp16_dynamo"),
    ("h6", "olmo3_sw4_kv_ts"), ("h6", "vaultgemma_sw4_kv_dynamo"), ("h6", "llama4_chunk4_nocache_ts"),
    ("h6b", "distilbert_encoder_ts"), ("h6b", "roberta_sdpa_encoder_ts"), ("h6b", "modernbert_lw4_encoder_ts_int8"),
    ("h6b", "t5gemma_sw4_full_nocache_ts"), ("h7", "genai_phi3_cpu_fp32"), ("h7", "genai_qwen2_dml_fp16"),
    ("h7", "genai_llama_webgpu_fp32"), ("h7", "llama_kv_ts_ortext"), ("h7", "gemma3_sw4_kv_dynamo_sim"),
    ("h7", "mistral_sw4_kv_dynamo_ortext"), ("h7", "mistral_sw4_kv_dynamo_slim_fp16"),
    ("m", "trilu_offsets_ts"), ("m", "trilu_offsets_dynamo"), ("m", "eye_dynamic_ts"), ("m", "band_w2_ts"),
    ("m", "band_w2_dynamo"), ("m", "concat_causal_halves_ts"), ("m", "split_concat_tril_ts"),
    ("m", "sliced_double_causal_ts"), ("m", "sliced_double_causal_dynamo"), ("m", "torch_transformer_decoder_dynamo"),
]
# a second batch (`--extra`): the other families and variants of the same rounds
EXTRA = [
    ("h6", "arcee_kv_ts"), ("h6", "ernie4_5_kv_dynamo"), ("h6", "glm4_kv_dynamo"), ("h6", "olmo2_kv_ts"),
    ("h6", "phimoe_sw4_kv_ts"), ("h6", "qwen3_moe_kv_dynamo"), ("h6", "seed_oss_kv_ts"), ("h6", "smollm3_kv_dynamo"),
    ("h6", "cohere2_sw4_kv_i32_dynamo"), ("h6", "exaone4_sw4_kv_ts_int8"), ("h6", "gpt_oss_sw4_kv_dynamo"),
    ("h6", "llama4_chunk4_kv_dynamo"), ("h6", "llama4_chunk4_nomask_dynamo"), ("h6", "ministral_sw4_kv_dynamo"),
    ("h6", "qwen2_sw4_kv_ts"), ("h6", "vaultgemma_sw4_kv_ts"), ("h6", "olmo3_sw4_kv_dynamo"),
    ("h4", "sdpaiscausal_dynamo23"), ("h4", "sdpatrilmask_ts"), ("h4", "sdpawindow_dynamo23"),
    ("h4", "bart_full_nocache_dynamo"), ("h4", "opt_whisper_decoder"), ("h4", "opt_whisper_merged"),
    ("h4", "llama_sdpa_kv_dynamo23raw"), ("h4", "gemma3_sw4_sdpa_kv_dynamo23raw"), ("h4", "bert_dynamo_ortopt1"),
    ("h4", "mistral_sw4_nocache_fp16_ts"), ("h2", "opt_llama_decoder"),
    ("h6b", "electra_encoder_ts"), ("h6b", "esm_encoder_dynamo"), ("h6b", "mpnet_encoder_ts"),
    ("h6b", "modernbert_lw4_sdpa_encoder_dynamo23raw"), ("h6b", "modernbert_lw4_encoder_ts_ortopt2"),
    ("h6b", "modernbert_decoder_lw4_kv_dynamo"), ("h6b", "t5gemma_sw4_decoder_kv_dynamo"),
    ("h6b", "roberta_encoder_ts_ortopt1"), ("h6b", "modernbert_lw4_sdpa_fp16_encoder_dynamo"),
    ("h7", "genai_llama_cpu_fp16"), ("h7", "genai_mistral_sw4_dml_fp16"), ("h7", "genai_gemma2_sw4_cpu_fp32"),
    ("h7", "genai_qwen3_cpu_int4"), ("h7", "genai_phi3_dml_fp16"), ("h7", "bert_dynamo_qdq"), ("h7", "bert_ts_slim"),
    ("h7", "bert_dynamo_ortext"), ("h7", "gemma3_sw4_kv_ts_sim_fp16"), ("h7", "gemma3_sw4_kv_ts_slim"),
    ("h7", "gemma3_sw4_kv_ts_ortbasic"), ("h7", "llama_kv_ts_sim_qdq"), ("h7", "llama_kv_dynamo_slim"),
    ("h7", "llama_kv_ts_fp16"), ("h7", "mistral_sw4_kv_dynamo_sim"), ("h7", "mistral_sw4_kv_ts_slim"),
    ("m", "llama_kv_dynamo"), ("m", "opt_kv_ts"), ("m", "bloom_kv_dynamo"), ("m", "gpt_neox_kv_dynamo"),
    ("m", "phi3_kv_ts"), ("m", "bert_dynamo"), ("m", "clip_text_dynamo"), ("m", "mistral_sw4_dynamo"),
    ("m", "llama_ts"), ("m", "nanogpt_dynamo"), ("m", "stored_tril_past_dynamo"), ("m", "trilu_past_dynamo"),
    ("m", "concat_past_zeros_dynamo"), ("m", "split_concat_tril_dynamo"), ("m", "concat_causal_halves_dynamo"),
    ("m", "eye_dynamic_dynamo"),
]
# round 9 (`--round9`): exports at opsets 14-16 (make_heldout9.py): TorchScript, Optimum, ort variants
ROUND9 = [
    ("h9", "llama_kv_ts14"), ("h9", "mistral_sw4_kv_ts14"), ("h9", "gemma2_sw4_kv_ts15"), ("h9", "t5_decoder_kv_ts16"),
    ("h9", "whisper_decoder_kv_ts14"), ("h9", "mistral_sw4_nocache_ts14"), ("h9", "bert_ts14"),
    ("h9", "opt_llama_merged"), ("h9", "opt_t5_merged"), ("h9", "llama_kv_ts14_int8"), ("h9", "gpt2_kv_ts14_ortopt"),
]
# round 10 (`--round10`): families no round exported and 24-layer decoders (make_heldout10.py)
ROUND10 = [
    ("h10", "longt5_local4_full_nocache_ts"), ("h10", "longt5_local4_full_nocache_dynamo"),
    ("h10", "longt5_tglobal4_full_nocache_ts"), ("h10", "bigbird_pegasus_bs8_full_nocache_ts"),
    ("h10", "longt5_local4_decoder_kv_ts"), ("h10", "deepseek_v3_kv_dynamo"), ("h10", "gemma3n_sw4_kv_ts"),
    ("h10", "dots1_sw4_kv_dynamo"), ("h10", "hunyuan_dense_kv_ts"), ("h10", "lfm2_nocache_ts"),
    ("h10", "bamba_nocache_dynamo"), ("h10", "mistral_sw4_l24_kv_ts"), ("h10", "llama_l24_kv_dynamo"),
]
# round 11 (`--round11`): static caches, chunked attention, sliding families (make_heldout11.py)
ROUND11 = [("h11", f"{m}_{e}") for m in ("llama_static", "mistral_sw4_static", "gemma2_sw4_static",
                                         "gemma3_sw4_static", "qwen2_sw4_static", "phi3_sw4_static",
                                         "starcoder2_sw4_static", "exaone4_sw4_static", "olmo3_sw4_static",
                                         "llama4_chunk4_static", "qwen2_sw4_kv", "phi3_sw4_kv", "starcoder2_sw4_kv",
                                         "exaone4_sw4_kv", "olmo3_sw4_kv") for e in ("ts", "dynamo")]
ROUND11 += [("h11", "llama4_chunk4_kv_dynamo")]  # (its TorchScript export: a CumSum of bool, not built)
LONG = {"mistral_sw4_kv_ts", "gpt2_ts", "bert_ts", "modernbert_lw4_encoder_ts", "genai_mistral_sw4_cpu_fp32",
        "mistral_sw4_ts", "llama_kv_ts", "gemma2_sw4_kv_ts", "qwen2_mixed_sw4_kv_dynamo", "llama4_chunk4_kv_ts",
        "opt_llama_merged"}

W = WINDOW
KV_GRID = [(1, 0), (2, 0), (W - 1, 0), (W, 0), (W + 1, 0), (31, 0), (257, 0), (1, 1), (1, W - 1), (1, W),
           (1, W + 1), (1, 100), (1, 2047), (W - 1, W), (W + 1, W - 1), (W, W + 1), (64, 100), (2, 2047)]
KV_PADDED = [(W + 1, 0), (1, W), (1, W + 1), (W, 1), (3, 100), (1, 2047), (31, W - 1)]
SEQ_GRID = [1, 2, W - 1, W, W + 1, 31, 64, 257]
SEQ_PADDED = [1, W - 1, W, W + 1, 31]
ODD_GRID = [1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 31, 64, 257]
STATIC_GRID = [(1, 0), (2, 0), (W - 1, 0), (W, 0), (W + 1, 0), (1, 1), (1, W - 1), (1, W), (1, W + 1), (W - 1, W),
               (W, W), (W + 1, W - 1), (2, 14), (1, 15), (12, 4), (W, 12), (16, 0)]
STATIC_PAST_END = [(1, 16), (W, 14)]  # (positions past the cache: the original's own refusal or result)
RECT_GRID = [(1, 1), (1, 5), (5, 1), (2, 7), (7, 2), (3, 3), (W, W + 1), (W + 1, W), (9, 4), (31, 64), (64, 31),
             (257, 1), (1, 257), (257, 256)]


def _role(dim: str) -> str | None:
    n = dim.lower()
    if "+" in n or "total" in n:
        return "T"
    if "past" in n:
        return "P"
    if "encoder" in n or "mem" in n:
        return "E"
    if "batch" in n:
        return "B"
    if n == "cols":
        return "C"
    if "seq" in n or "len" in n or n in ("n", "rows"):
        return "S"
    return None


_NP = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16, onnx.TensorProto.DOUBLE: np.float64,
       onnx.TensorProto.INT64: np.int64, onnx.TensorProto.INT32: np.int32, onnx.TensorProto.BOOL: np.bool_,
       onnx.TensorProto.UINT8: np.uint8, onnx.TensorProto.INT8: np.int8}


class Signature:
    """The model's graph inputs with a role per axis (B, S, P, T = P + S, E, or a fixed size)."""

    def __init__(self, path: str, saved: list[dict[str, np.ndarray]]):
        m = onnx.load(path, load_external_data=False)
        init = {i.name for i in m.graph.initializer}
        self.inputs = []
        for i in m.graph.input:
            if i.name in init:
                continue
            t = i.type.tensor_type
            self.inputs.append((i.name, _NP[t.elem_type], [d.dim_param or (d.dim_value or None) for d in t.shape.dim]))
        names = [n for n, _, _ in self.inputs]
        self.kv = any("past" in n for n in names)
        # a static cache: cache_position beside caches of a fixed length (positions, not a past length)
        fixed = [dims[2] for n, _, dims in self.inputs if "past" in n and len(dims) == 4]
        self.static = self.kv and "cache_position" in names and all(isinstance(d, int) for d in fixed)
        self.ids = next((n for n in names if n in ("input_ids", "idx", "decoder_input_ids")), None)
        self.mask = "attention_mask" if "attention_mask" in names else None
        # encoder-decoders without a cache (bart): the padded mask is the encoder's, sized like input_ids
        self.encoder = not self.kv and "decoder_input_ids" not in names and self.ids is not None and \
            not any("position" in n for n in names)
        # which saved set fixes the roles of unnamed dims: the one whose B, S, P are most distinct
        self.saved = saved
        self.ref = max(saved, key=lambda s: len({*self._bsp(s)}), default=None)
        self.vocab = max([int(s[self.ids].max()) + 1 for s in saved if self.ids in s] or [30])
        self.roles = {}
        for n, _, dims in self.inputs:
            r = []
            for ax, d in enumerate(dims):
                role = _role(d) if isinstance(d, str) else None
                if n == "attention_mask" and ax == len(dims) - 1 and self.kv:
                    role = "T"  # Optimum names its length like input_ids's; it is past + sequence
                if n == "attention_mask" and ax == len(dims) - 1 and "decoder_input_ids" in names:
                    role = "E"
                if role is None and self.ref is not None and n in self.ref:
                    v = self.ref[n].shape[ax]
                    b, s, p = self._bsp(self.ref)
                    hits = [k for k, x in (("B", b), ("S", s), ("P", p), ("T", p + s)) if x == v]
                    role = hits[0] if len(hits) == 1 and not isinstance(d, int) else int(v)
                if role is None:
                    role = d if isinstance(d, int) else 16
                r.append(role)
            self.roles[n] = r

    def _bsp(self, s: dict) -> tuple[int, int, int]:
        ids = s.get(self.ids) if self.ids else None
        b, q = (ids.shape if ids is not None and ids.ndim == 2 else (1, 1))
        past = [v.shape[2] for k, v in s.items() if "past" in k and "encoder" not in k and v.ndim == 4]
        return int(b), int(q), int(past[0]) if past else 0

    def saved_e(self) -> int:
        for s in self.saved:
            for n, r in self.roles.items():
                if "E" in r and n in s:
                    return int(s[n].shape[r.index("E")])
        return 5


def _mask(b: int, t: int, pad: str) -> np.ndarray:
    m = np.ones((b, t), np.int64)
    if pad in ("left", "fullrow"):
        if b > 0:
            m[0, :min(2, t - 1)] = 0
        if b > 2:
            m[2, :(t - 1) // 2] = 0
        if pad == "fullrow":
            m[0, :] = 0
    elif pad == "right":
        if b > 0 and t > 1:
            m[0, t - min(2, t - 1):] = 0
        if b > 2 and t > 2:
            m[2, t - (t - 1) // 2:] = 0
    return m


def make_set(sig: Signature, b: int, s: int, p: int, pad: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One input set. `pad` none / left / right / fullrow, or an off-claim probe: long1 / short1 (the
    attention_mask one longer / shorter than past + sequence), maskb1 (the mask of batch 1 for a
    batch of 3), enc1 / enc33 (encoder length 1 / 33 beside a cache); special: float inputs
    (data, the cache, encoder states) hold -0.0, NaN and infinities."""
    e = {"enc1": 1, "enc33": 33}.get(pad, s if not sig.kv else sig.saved_e())
    t = p + s + {"long1": 1, "short1": -1}.get(pad, 0)
    size = {"B": b, "S": s, "P": p, "T": t, "E": e, "C": p or s}
    feeds: dict[str, np.ndarray] = {}
    mask = _mask(b, t, pad)
    ref = sig.ref or {}
    for n, dt, _ in sig.inputs:
        shape = [size[r] if isinstance(r, str) else r for r in sig.roles[n]]
        if n == "attention_mask":
            v = _mask(b, shape[-1], pad) if shape[-1] != t else mask
            if pad == "maskb1":
                shape[0] = 1
                v = v[:1]
            feeds[n] = v.astype(dt).reshape(shape)
        elif n == "encoder_attention_mask":
            feeds[n] = np.ones(shape, dt)
        elif "input_ids" in n or n == "idx":
            feeds[n] = rng.integers(1, max(2, sig.vocab), size=shape).astype(dt)
        elif n == "position_ids":
            full = _mask(b, p + s, pad)
            pos = np.cumsum(full, axis=1) - 1
            pos = np.where(full == 0, 1, pos)[:, -s:]
            feeds[n] = pos.astype(dt).reshape(shape)
        elif n == "cache_position":
            feeds[n] = np.arange(p, p + s, dtype=dt).reshape(shape)
        elif n == "use_cache_branch":
            feeds[n] = np.array([p > 0], dt).reshape(shape)
        elif n == "token_type_ids":
            feeds[n] = np.zeros(shape, dt)
        elif np.dtype(dt).kind == "f":
            v = (rng.standard_normal(shape) * 0.5).astype(dt)
            if pad == "special" and v.size:  # -0.0 (a quarter of the entries), NaN, +inf, -inf
                flat = v.reshape(-1)
                flat[rng.random(flat.size) < 0.25] = -0.0
                flat[rng.integers(0, flat.size, 3)] = [np.nan, np.inf, -np.inf]
            feeds[n] = v
        elif n in ref and list(ref[n].shape) == shape:
            feeds[n] = ref[n]
        else:
            feeds[n] = np.zeros(shape, dt)
    return feeds


def grid(sig: Signature, name: str) -> list[tuple[str, int, int, int, str]]:
    sets = []
    if sig.static:
        sets += [(f"b1_s{s}_pos{p}", 1, s, p, "none") for s, p in STATIC_GRID + STATIC_PAST_END]
        sets.append((f"special_s{W + 1}_pos{W}", 1, W + 1, W, "special"))
        return sets
    if sig.kv:
        sets += [(f"b1_s{s}_p{p}", 1, s, p, "none") for s, p in KV_GRID]
        sets += [(f"b3left_s{s}_p{p}", 3, s, p, "left") for s, p in KV_PADDED]
        sets += [("b3fullrow_s4_p3", 3, W, W - 1, "fullrow"), ("b3fullrow_s1_p5", 3, 1, W + 1, "fullrow")]
        sets += [(f"b1_s{s}_p{p}", 1, s, p, "none") for s, p in ((257, W + 1), (31, 100), (W + 1, 2047), (257, 2047))]
        if name in LONG:
            sets += [("b1_s1024_p0", 1, 1024, 0, "none"), ("b1_s1024_p1", 1, 1024, 1, "none")]
        sets += [("probe_long1_s3_p4", 1, 3, 4, "long1"), ("probe_short1_s3_p4", 1, 3, 4, "short1"),
                 ("probe_short1_s1_p5", 1, 1, W + 1, "short1"), ("probe_maskb1_s3_p4", 3, 3, 4, "maskb1")]
        if any("E" in r for r in sig.roles.values()):
            sets += [("probe_enc1_s3_p4", 1, 3, 4, "enc1"), ("probe_enc33_s1_p5", 1, 1, W + 1, "enc33")]
    elif any("C" in r for r in sig.roles.values()):  # rows x cols (P stands for cols here)
        sets += [(f"b1_r{r}_c{c}", 1, r, c, "none") for r, c in RECT_GRID]
        sets += [(f"b3_r{r}_c{c}", 3, r, c, "none") for r, c in ((W, W + 1), (31, 64))]
    elif sig.ids is None:  # data in, no ids: the odd sizes too (halves, splits)
        sets += [(f"b1_s{s}", 1, s, 0, "none") for s in ODD_GRID]
        sets += [(f"b3_s{s}", 3, s, 0, "none") for s in (W, 17)]
    else:
        sets += [(f"b1_s{s}", 1, s, 0, "none") for s in SEQ_GRID + ([1024] if name in LONG else [])]
        if sig.mask:
            pad = "right" if sig.encoder else "left"
            sets += [(f"b3{pad}_s{s}", 3, s, 0, pad) for s in SEQ_PADDED]
            if sig.encoder:
                sets += [(f"b3left_s{s}", 3, s, 0, "left") for s in (W, 31)]
            sets += [("b3fullrow_s5", 3, W + 1, 0, "fullrow")]
            sets += [("probe_long1_s5", 1, W + 1, 0, "long1"), ("probe_short1_s5", 1, W + 1, 0, "short1"),
                     ("probe_maskb1_s5", 3, W + 1, 0, "maskb1")]
        else:
            sets += [(f"b3_s{s}", 3, s, 0, "none") for s in (W, 31)]
    b, s, p = (1, W + 1, W) if sig.kv else (1, W + 1, 0)
    sets.append((f"special_s{s}_p{p}", b, s, p, "special"))
    return sets


def _session(path: str) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def compare(ref: list[np.ndarray], got: list[np.ndarray]) -> tuple[str, float]:
    """("exact" | "equal" | "mismatch", max abs diff over the finite entries both have)."""
    if all(x.shape == y.shape and x.dtype == y.dtype and x.tobytes() == y.tobytes() for x, y in zip(ref, got)):
        return "exact", 0.0
    status, diff = "equal", 0.0
    for x, y in zip(ref, got):
        if x.shape != y.shape:
            return "mismatch", float("inf")
        if x.dtype.kind != "f":
            if not np.array_equal(x, y):
                status, diff = "mismatch", float("inf")
            continue
        xs, ys = x.astype(np.float64), y.astype(np.float64)
        fx, fy = np.isfinite(xs), np.isfinite(ys)
        if not (np.array_equal(np.isnan(xs), np.isnan(ys)) and np.array_equal(fx, fy)
                and np.array_equal(xs[~fx & ~np.isnan(xs)], ys[~fy & ~np.isnan(ys)])):
            status, diff = "mismatch", float("inf")
            continue
        both = fx & fy
        if both.any():
            d = np.abs(xs[both] - ys[both])
            diff = max(diff, float(d.max()))
            rtol = RTOL16 if x.dtype == np.float16 else RTOL
            if not (d <= ATOL + rtol * np.abs(xs[both])).all():
                status = "mismatch"
    return status, diff


def _optimize(path: str, out: str, target: str, exact: bool) -> dict:
    args = [sys.executable, "-m", "dmlgraph", "optimize", path, "-o", out, "--target", target, "--json"]
    if exact:
        args.append("--exact")
    t0 = time.perf_counter()
    p = subprocess.run(args, capture_output=True, text=True)
    r: dict = {"exit": p.returncode, "seconds": round(time.perf_counter() - t0, 1)}
    try:
        doc = json.loads(p.stdout)
        r.update(nodes=[doc["before"]["nodes"], doc["after"]["nodes"]], rewrites=doc["rewrites"])
    except (json.JSONDecodeError, KeyError, TypeError):
        r["error"] = (p.stderr.strip().splitlines() or [""])[-1][:300]
    return r


class DmlRunner:
    """The dml output in dmlgraph's executor (one thread), loaded once."""

    def __init__(self, path: str):
        _, self.g = pipeline.load(path)
        self.ex = Executor(self.g, threads=1, optimize=False)

    def run(self, feeds: dict) -> list[np.ndarray]:
        out = self.ex.run(pipeline.apply_overrides(self.g, pipeline.as_feeds(self.g, feeds)))
        return [out[v.name] for v in self.g.outputs]


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"


def measure(d: str, name: str, tmp: str, rng: np.random.Generator, log=None) -> dict:
    path = os.path.join(_D.get(d, d), name + ".onnx")
    saved_dir = os.path.join(os.path.dirname(path), "inputs", name)
    saved = [dict(np.load(f)) for f in sorted(glob.glob(os.path.join(saved_dir, "*.npz")))]
    row: dict = {"model": name, "dir": os.path.dirname(path), "targets": {}, "sets": {}}
    try:
        original = _session(path)
    except Exception as e:  # noqa: BLE001 (onnxruntime itself cannot load the original: skipped)
        row["skipped"] = "original does not load: " + _err(e)
        return row
    sig = Signature(path, saved)
    row["roles"] = {k: [str(r) for r in v] for k, v in sig.roles.items()}
    runners: dict = {}
    dml_path = ""
    for key, target, exact in (("dml", "dml", False), ("onnx", "onnx", False), ("onnx_exact", "onnx", True)):
        out = os.path.join(tmp, f"{name}.{key}.onnx")
        dml_path = out if key == "dml" else dml_path
        row["targets"][key] = _optimize(path, out, target, exact)
        if row["targets"][key]["exit"] != 0:
            continue
        try:
            runners[key] = DmlRunner(out) if key == "dml" else _session(out)
        except Exception as e:  # noqa: BLE001 (recorded, not hidden)
            row["targets"][key]["load"] = _err(e)
    onames = [o.name for o in original.get_outputs()]
    for label, b, s, p, pad in grid(sig, name):
        feeds = make_set(sig, b, s, p, pad, rng)
        rec: dict = {"B": b, "S": s, "P": p, "pad": pad}
        try:
            ref = original.run(None, feeds)
        except Exception as e:  # noqa: BLE001 (onnxruntime refuses the original at this size)
            rec["original"] = "refuses: " + _err(e)
            row["sets"][label] = rec
            continue
        # onnxruntime's sliding-window GroupQueryAttention keeps state in a session (genai's gemma2
        # builds): a second run of the same inputs may differ, and then nothing can be compared
        st, diff = compare(ref, original.run(None, feeds))
        if st != "exact":
            rec["original"] = f"unstable: a second run in its session differs by {diff:.3g}"
            row["sets"][label] = rec
            continue
        for key, r in runners.items():
            try:
                if key == "dml":
                    got = r.run(feeds)
                else:
                    got = r.run(onames, feeds)
                st, diff = compare(ref, got)
                rec[key] = st if st == "exact" else f"{st} {diff:.3g}"
                if key == "dml" and st == "mismatch":
                    # The executor cuts the graph into sessions: float16 values crossing a cut round
                    # where the original's did not. `validate` runs the original cut alike.
                    v = dmlgraph.validate(path, dml_path, feeds, threads=1)
                    detail = "; ".join(f"{c.name} {c.detail}" for c in v.outputs + v.tensors if not c.match)
                    rec[key] = f"equal (cut rounding {diff:.3g}; validate ok)" if v.ok else \
                        f"mismatch {diff:.3g}; validate: {detail[:300]}"
            except DmlgraphError as e:
                rec[key] = "refused: " + _err(e)
            except Exception as e:  # noqa: BLE001 (recorded, not hidden)
                # onnxruntime's own errors on a lowered model (a run-time guard, a shape it refuses)
                # are refusals; anything else raised is a crash
                ours = type(e).__module__.startswith("onnxruntime")
                rec[key] = ("refused: " if ours else "crash: ") + _err(e)
        for key in runners:
            if _finite_only(row, rec, key):
                rec[key] = "finite-only (mask_arith, non-finite data): " + rec[key]
        row["sets"][label] = rec
        if log and any(str(v).split()[0] not in ("exact", "equal") for k, v in rec.items() if k in runners):
            print(f"  {name} {label}: " + "; ".join(f"{k}={rec[k]}" for k in runners), file=log, flush=True)
    return row


def _finite_only(row: dict, rec: dict, key: str) -> bool:
    """A mismatch the rules document: mask_arith's Add/Mul of a band (not in --exact outputs) is
    equal only for finite data, and the `special` set feeds NaN and infinities."""
    return rec.get("pad") == "special" and str(rec.get(key, "")).startswith("mismatch") and key != "onnx_exact" \
        and bool(row["targets"][key].get("rewrites", {}).get("mask_arith"))


def counts(row: dict) -> dict[str, collections.Counter]:
    c: dict[str, collections.Counter] = {k: collections.Counter() for k in ("dml", "onnx", "onnx_exact")}
    for rec in row["sets"].values():
        for k in c:
            if "original" in rec:
                c[k]["original " + rec["original"].split(":")[0]] += 1
            elif k in rec:
                st = rec[k].split()[0].rstrip(":").split("(")[0]
                if st == "mismatch" and _finite_only(row, rec, k):
                    st = "finite-only"
                c[k][st] += 1
            else:
                c[k]["not run"] += 1
    return c


def table(rows: list[dict]) -> None:
    keys = ("exact", "equal", "finite-only", "mismatch", "refused", "crash", "original refuses", "original unstable")
    print("| model | sets | dml " + " / ".join(keys[:6]) + " | onnx | onnx --exact | original refuses / unstable |")
    print("|---|---|---|---|---|---|")
    tot = {k: collections.Counter() for k in ("dml", "onnx", "onnx_exact")}
    for r in rows:
        if "skipped" in r:
            print(f"| {r['model']} | skipped: {r['skipped'][:80]} |")
            continue
        c = counts(r)
        for k in tot:
            tot[k].update(c[k])
        cells = [" / ".join(str(c[k][x]) for x in keys[:6]) for k in ("dml", "onnx", "onnx_exact")]
        ex = {k: r["targets"][k]["exit"] for k in r["targets"]}
        bad = [k for k, v in ex.items() if v]
        print(f"| {r['model']} | {len(r['sets'])} | " + " | ".join(cells) +
              f" | {c['dml']['original refuses']} / {c['dml']['original unstable']}"
              f"{' (exit ' + str(bad) + ')' if bad else ''} |")
    print("total: " + "; ".join(f"{k}: " + ", ".join(f"{x} {n}" for x, n in sorted(v.items())) for k, v in tot.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=os.path.join(HERE, "..", "..", "out", "sizes8", "sizes.json"))
    ap.add_argument("--only", nargs="*", help="model name substrings")
    ap.add_argument("--extra", action="store_true", help="the second batch of models (EXTRA) instead")
    ap.add_argument("--round9", action="store_true", help="round 9's opset 14-16 exports (ROUND9) instead")
    ap.add_argument("--round10", action="store_true", help="round 10's families and 24-layer decoders (ROUND10)")
    ap.add_argument("--round11", action="store_true", help="round 11's static caches and sliding families (ROUND11)")
    ap.add_argument("--rows", action="store_true", help="print the table of the --json file instead of measuring")
    ap.add_argument("--dir", action="append", default=[], metavar="KEY=PATH",
                    help=f"a round's folder, if not the default ({', '.join(sorted(_D))}: models/, out/heldoutN)")
    args = ap.parse_args(argv)
    for item in args.dir:
        key, sep, path = item.partition("=")
        if not sep or key not in _D:
            ap.error(f"--dir takes KEY=PATH with KEY one of {', '.join(sorted(_D))}, not {item!r}")
        _D[key] = path
    if args.rows:
        with open(args.json) as f:
            table(json.load(f))
        return 0
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    chosen = ROUND11 if args.round11 else ROUND10 if args.round10 else ROUND9 if args.round9 else EXTRA \
        if args.extra else MODELS
    models = [(d, n) for d, n in chosen
              if not args.only or any(w in n for w in args.only)]
    rng = np.random.default_rng(8)
    with tempfile.TemporaryDirectory() as tmp:
        rows = measure_all(models, lambda d, n: measure(d, n, tmp, rng, log=sys.stderr), args.json,
                           lambda row: "; ".join(f"{k} {dict(v)}" for k, v in counts(row).items()))
    table(rows)
    return 0


def measure_all(models: list[tuple[str, str]], measure_one: Callable[[str, str], dict], path: str,
                summary: Callable[[dict], str]) -> list[dict]:
    """`measure_one(folder key, name)` of each model, timed, a line each on stderr, the rows so far
    rewritten to `path` after each (a long round interrupted keeps what it measured)."""
    rows: list[dict] = []
    for d, n in models:
        t0 = time.perf_counter()
        rows.append(measure_one(d, n))
        rows[-1]["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"measured {n} ({rows[-1]['seconds']}s): {summary(rows[-1])}", file=sys.stderr, flush=True)
        with open(path, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    return rows


if __name__ == "__main__":
    sys.exit(main())
