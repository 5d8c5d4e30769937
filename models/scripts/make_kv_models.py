"""Build the KV-cache corpus: decoders exported the way they are deployed for generation.

Run under the torch venv described in make_models.py:

    /work/torchenv/bin/python models/make_kv_models.py [NAME_SUBSTRING ...]

Every transformers model is built from a tiny random config (never downloaded), eager attention,
and wrapped in a module that takes flat tensors: `input_ids` [batch, sequence], a padded
`attention_mask` [batch, past_sequence + sequence] and `past_key_values.{i}.key/value`
[batch, heads, past_sequence, head_dim], and returns `logits` and `present.{i}.key/value`. The
wrapper rebuilds a transformers DynamicCache from the flat tensors, as optimum-style exports do.
Each family is exported by the TorchScript exporter (opset 17) and the dynamo exporter (opset 18),
checked in onnxruntime against torch (rtol/atol 1e-4) at every input set, and the input sets are
saved as models/inputs/<model>/<set>.npz. The masks of the family reach the graph through the
family's own mask code (transformers' masking_utils, alibi, relative buckets...).

A second group (sliced_*) are small hand-written modules that reach causal masks through
Split/Concat/Slice of a shape-built or stored mask.

Exports that fail are recorded in models/kv_export_log.json (its own log: make_models.py rewrites
export_log.json, and the tests that assert lowering read expected.json's `models` list only).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn as nn

from make_models import DYNAMO_OPSET, TS_OPSET, _fix_ir

HERE = os.path.dirname(os.path.abspath(__file__))
INPUTS = os.path.join(HERE, "inputs")
LOG = os.path.join(HERE, "kv_export_log.json")
VOCAB = 100
TOTAL = "past_sequence + sequence"  # the attention_mask / present length, named as the dynamo exporter does

warnings.filterwarnings("ignore")


# --------------------------------------------------------------------------------------------
# the input sets
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class InputSet:
    """One run of a KV model: sizes and which rows of attention_mask start with padding."""

    name: str
    batch: int
    past: int
    seq: int
    left_pad: int = 0  # zeros at the start of the first row's attention_mask


KV_SETS = (InputSet("prefill", 1, 0, 4), InputSet("prefill_past", 2, 5, 3), InputSet("decode", 2, 7, 1),
           InputSet("left_padded", 2, 4, 3, left_pad=2))


def kv_feeds(s: InputSet, layers: int, kv_shape: tuple[int, int], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded feeds for one input set: int64 ids and mask, float32 past (zero-size when past is 0)."""
    rng = np.random.default_rng(seed + 1000 * s.past + 10 * s.seq + s.batch)
    feeds = {"input_ids": rng.integers(0, VOCAB, (s.batch, s.seq)).astype(np.int64)}
    mask = np.ones((s.batch, s.past + s.seq), np.int64)
    mask[0, :s.left_pad] = 0
    feeds["attention_mask"] = mask
    heads, head_dim = kv_shape
    for i in range(layers):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = rng.standard_normal(
                (s.batch, heads, s.past, head_dim)).astype(np.float32)
    return feeds


# --------------------------------------------------------------------------------------------
# wrappers: flat tensors in and out
# --------------------------------------------------------------------------------------------

class DecoderWithPast(nn.Module):
    """A transformers causal LM taking (input_ids, attention_mask, *flat past) -> (logits, *flat present)."""

    def __init__(self, model: nn.Module, layers: int) -> None:
        super().__init__()
        self.model = model
        self.layers = layers

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from transformers import DynamicCache
        cache = DynamicCache([(past[2 * i], past[2 * i + 1]) for i in range(self.layers)])
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                         use_cache=True, return_dict=True)
        return (out.logits, *_flat_present(out.past_key_values, self.layers))


class Seq2SeqDecoderWithPast(nn.Module):
    """An encoder-decoder's decoder step: the self-attention cache is flat input/output; the
    cross-attention keys/values are recomputed from encoder_hidden_states (an empty cross cache)."""

    def __init__(self, model: nn.Module, layers: int) -> None:
        super().__init__()
        self.model = model
        self.layers = layers

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, encoder_hidden_states: torch.Tensor,
                encoder_attention_mask: torch.Tensor, *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from transformers import DynamicCache, EncoderDecoderCache
        cache = EncoderDecoderCache(DynamicCache([(past[2 * i], past[2 * i + 1]) for i in range(self.layers)]),
                                    DynamicCache())
        out = self.model(encoder_outputs=(encoder_hidden_states,), attention_mask=encoder_attention_mask,
                         decoder_input_ids=input_ids, decoder_attention_mask=attention_mask,
                         past_key_values=cache, use_cache=True, return_dict=True)
        return (out.logits, *_flat_present(out.past_key_values.self_attention_cache, self.layers))


def _flat_present(cache: object, layers: int) -> list[torch.Tensor]:
    """present.{i}.key/value in export order (the cache objects themselves cannot be outputs)."""
    flat = []
    for i in range(layers):
        flat += [cache.layers[i].keys, cache.layers[i].values]
    return flat


class TextEncoder(nn.Module):
    """A text encoder with a causal mask (CLIP): input_ids, attention_mask -> last_hidden_state."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True).last_hidden_state


# --------------------------------------------------------------------------------------------
# the families (tiny random configs)
# --------------------------------------------------------------------------------------------

_SMALL = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=2, max_position_embeddings=64, attn_implementation="eager")


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                      bos_token_id=0, eos_token_id=0, attn_implementation="eager"))


def llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(num_key_value_heads=1, **_SMALL))


def mistral_sw4() -> nn.Module:
    from transformers import MistralConfig, MistralForCausalLM
    return MistralForCausalLM(MistralConfig(num_key_value_heads=1, sliding_window=4, **_SMALL))


def qwen2_mixed_sw4() -> nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM
    return Qwen2ForCausalLM(Qwen2Config(num_key_value_heads=1, use_sliding_window=True, sliding_window=4,
                                        max_window_layers=1, **_SMALL))


def phi3() -> nn.Module:
    from transformers import Phi3Config, Phi3ForCausalLM
    return Phi3ForCausalLM(Phi3Config(num_key_value_heads=1, pad_token_id=0, bos_token_id=0, eos_token_id=0,
                                      **_SMALL))


def gemma2_sw4() -> nn.Module:
    from transformers import Gemma2Config, Gemma2ForCausalLM
    return Gemma2ForCausalLM(Gemma2Config(num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16,
                                          sliding_window=4, pad_token_id=0, bos_token_id=0, eos_token_id=0,
                                          **_SMALL))


def gpt_neox() -> nn.Module:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
    return GPTNeoXForCausalLM(GPTNeoXConfig(bos_token_id=0, eos_token_id=0, **_SMALL))


def opt() -> nn.Module:
    from transformers import OPTConfig, OPTForCausalLM
    return OPTForCausalLM(OPTConfig(vocab_size=VOCAB, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                                    num_attention_heads=2, max_position_embeddings=64, word_embed_proj_dim=32,
                                    pad_token_id=1, bos_token_id=0, eos_token_id=0, attn_implementation="eager"))


def bloom() -> nn.Module:
    from transformers import BloomConfig, BloomForCausalLM
    return BloomForCausalLM(BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=2,
                                        bos_token_id=0, eos_token_id=0, attn_implementation="eager"))


def t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration
    return T5ForConditionalGeneration(T5Config(vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2,
                                               num_decoder_layers=2, num_heads=2, relative_attention_num_buckets=8,
                                               relative_attention_max_distance=16, decoder_start_token_id=0,
                                               pad_token_id=0, eos_token_id=1, attn_implementation="eager"))


def clip_text() -> nn.Module:
    from transformers import CLIPTextConfig, CLIPTextModel
    return CLIPTextModel(CLIPTextConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=64,
                                        pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                        attn_implementation="eager"))


# --------------------------------------------------------------------------------------------
# hand-written modules reaching masks through Split/Concat/Slice
# --------------------------------------------------------------------------------------------

class _Attention(nn.Module):
    """Single-head attention whose boolean mask (True = attend) comes from `mask_fn(T, x)`."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.d = d

    def attend(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).split(self.d, dim=-1)
        att = q @ k.transpose(-2, -1) / self.d ** 0.5
        att = att.masked_fill(~keep, float("-inf"))
        return att.softmax(-1) @ v


class SlicedDoubleCausal(_Attention):
    """Causal mask built once for 2*T (arange compare) and sliced to [:T, :T]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        r = torch.arange(2 * t, device=x.device)
        big = r[None, :] <= r[:, None]
        return self.attend(x, big[:t, :t])


class SplitConcatStoredTril(_Attention):
    """A stored 64x64 tril buffer split into row halves, concatenated back, then sliced to [:T, :T]."""

    def __init__(self, d: int = 16, block: int = 64) -> None:
        super().__init__(d)
        self.register_buffer("tril", torch.tril(torch.ones(block, block, dtype=torch.bool)))
        self.half = block // 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        top, bottom = self.tril.split(self.half, dim=0)
        return self.attend(x, torch.cat([top, bottom], dim=0)[:t, :t])


class ConcatCausalHalves(_Attention):
    """Causal mask made as torch.cat of two row blocks: rows [0, h) and rows [h, T), h = T // 2."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        h = t // 2
        cols = torch.arange(t, device=x.device)[None, :]
        top = cols <= torch.arange(h, device=x.device)[:, None]
        bottom = cols <= torch.arange(h, t, device=x.device)[:, None]
        return self.attend(x, torch.cat([top, bottom], dim=0))


class _TinyKV(nn.Module):
    """One-head attention with a flat key/value cache; subclasses add the causal mask to the scores
    the way a generation of transformers did it by hand."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.qkv = nn.Linear(d, 3 * d)
        self.head = nn.Linear(d, VOCAB)
        self.d = d

    def masked(self, att: torch.Tensor, q_len: int, k_len: int) -> torch.Tensor:
        """The scores [batch, 1, q_len, k_len] with the causal mask applied (each subclass's idiom)."""
        raise NotImplementedError(f"{type(self).__name__} must define masked()")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, past_key: torch.Tensor,
                past_value: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = self.emb(input_ids)
        q, k, v = self.qkv(x).split(self.d, dim=-1)
        q, k, v = q[:, None], torch.cat([past_key, k[:, None]], dim=2), torch.cat([past_value, v[:, None]], dim=2)
        att = self.masked(q @ k.transpose(-2, -1) / self.d ** 0.5, q.shape[-2], k.shape[-2])
        att = att + (1.0 - attention_mask[:, None, None, :].to(att.dtype)) * torch.finfo(att.dtype).min
        y = att.softmax(-1) @ v
        return self.head(y[:, 0]), k, v


class StoredTrilWithPast(_TinyKV):
    """GPT-2 (transformers 4.x) style: a stored 64x64 tril buffer sliced to rows
    [past, past + seq) and columns [0, past + seq), applied with Where."""

    def __init__(self, d: int = 16, block: int = 64) -> None:
        super().__init__(d)
        self.register_buffer("bias", torch.tril(torch.ones(block, block, dtype=torch.bool)).view(1, 1, block, block))

    def masked(self, att: torch.Tensor, q_len: int, k_len: int) -> torch.Tensor:
        causal = self.bias[:, :, k_len - q_len:k_len, :k_len]
        return torch.where(causal, att, torch.tensor(torch.finfo(att.dtype).min, dtype=att.dtype))


class ConcatPastZeros(_TinyKV):
    """transformers 4.3x `_make_causal_mask`: a [seq, seq] finfo.min/0 causal square made with
    masked_fill(arange < arange + 1), Concatenated after a [seq, past] block of zeros, added."""

    def masked(self, att: torch.Tensor, q_len: int, k_len: int) -> torch.Tensor:
        low = torch.finfo(att.dtype).min
        mask = torch.full((q_len, q_len), low, dtype=att.dtype)
        cond = torch.arange(q_len)
        mask = mask.masked_fill(cond < (cond + 1).view(q_len, 1), 0.0)
        mask = torch.cat([torch.zeros(q_len, k_len - q_len, dtype=att.dtype), mask], dim=-1)
        return att + mask


class TriluPast(_TinyKV):
    """torch.triu(full(finfo.min), diagonal=past + 1) over [seq, past + seq]: a Trilu whose k comes
    from the shapes, added to the scores."""

    def masked(self, att: torch.Tensor, q_len: int, k_len: int) -> torch.Tensor:
        full = torch.full((q_len, k_len), torch.finfo(att.dtype).min, dtype=att.dtype)
        return att + torch.triu(full, diagonal=k_len - q_len + 1)


# --------------------------------------------------------------------------------------------
# specs, export, verification
# --------------------------------------------------------------------------------------------

@dataclass
class Spec:
    """One model to export: how to build it, its inputs/outputs, dims and input sets."""

    base: str
    source: str
    build: Callable[[], nn.Module]
    kind: str  # "decoder", "seq2seq", "encoder", "plain", "stored_kv" (a _TinyKV)
    sets: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    input_names: list[str] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)
    ts_axes: dict[str, dict[int, str]] = field(default_factory=dict)


def _layers_and_kv(module: nn.Module, kind: str) -> tuple[int, tuple[int, int]]:
    """Number of layers and (kv heads, head dim), read from a real prefill without a cache."""
    ids = torch.zeros(1, 2, dtype=torch.int64)
    with torch.no_grad():
        if kind == "seq2seq":
            enc = torch.zeros(1, 3, module.config.d_model)
            out = module(encoder_outputs=(enc,), decoder_input_ids=ids, use_cache=True, return_dict=True)
            cache = out.past_key_values.self_attention_cache
        else:
            cache = module(input_ids=ids, use_cache=True, return_dict=True).past_key_values
    k = cache.layers[0].keys
    return len(cache.layers), (int(k.shape[1]), int(k.shape[3]))


def prepare(spec: Spec) -> nn.Module:
    """Build the module to export and fill the spec's names, axes and input sets."""
    torch.manual_seed(0)
    inner = spec.build().eval()
    if spec.kind in ("decoder", "seq2seq"):
        layers, kv = _layers_and_kv(inner, spec.kind)
        module = (DecoderWithPast if spec.kind == "decoder" else Seq2SeqDecoderWithPast)(inner, layers)
        past = [f"past_key_values.{i}.{k}" for i in range(layers) for k in ("key", "value")]
        extra = ["encoder_hidden_states", "encoder_attention_mask"] if spec.kind == "seq2seq" else []
        spec.input_names = ["input_ids", "attention_mask", *extra, *past]
        spec.output_names = ["logits"] + [n.replace("past_key_values", "present") for n in past]
        spec.ts_axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: TOTAL},
                        "logits": {0: "batch", 1: "sequence"}}
        spec.ts_axes.update({n: {0: "batch", 2: "past_sequence"} for n in past})
        spec.ts_axes.update({n: {0: "batch", 2: TOTAL} for n in spec.output_names[1:]})
        for s in KV_SETS:
            feeds = kv_feeds(s, layers, kv)
            if spec.kind == "seq2seq":
                rng = np.random.default_rng(7 + s.batch)
                feeds["encoder_hidden_states"] = rng.standard_normal((s.batch, 5, inner.config.d_model)).astype(np.float32)
                feeds["encoder_attention_mask"] = np.ones((s.batch, 5), np.int64)
                spec.ts_axes["encoder_hidden_states"] = {0: "batch", 1: "encoder_sequence"}
                spec.ts_axes["encoder_attention_mask"] = {0: "batch", 1: "encoder_sequence"}
            spec.sets[s.name] = {n: feeds[n] for n in spec.input_names}
        return module
    if spec.kind == "encoder":
        module = TextEncoder(inner)
        spec.input_names, spec.output_names = ["input_ids", "attention_mask"], ["last_hidden_state"]
        spec.ts_axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
                        "last_hidden_state": {0: "batch", 1: "sequence"}}
        rng = np.random.default_rng(3)
        for name, b, t, pad in (("seq5", 1, 5, 0), ("seq9", 2, 9, 0), ("right_padded", 2, 7, 3)):
            mask = np.ones((b, t), np.int64)
            mask[0, t - pad:] = 0
            spec.sets[name] = {"input_ids": rng.integers(0, VOCAB, (b, t)).astype(np.int64), "attention_mask": mask}
        return module
    if spec.kind == "stored_kv":
        spec.input_names = ["input_ids", "attention_mask", "past_key", "past_value"]
        spec.output_names = ["logits", "present_key", "present_value"]
        spec.ts_axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: TOTAL},
                        "past_key": {0: "batch", 2: "past_sequence"}, "past_value": {0: "batch", 2: "past_sequence"},
                        "logits": {0: "batch", 1: "sequence"}, "present_key": {0: "batch", 2: TOTAL},
                        "present_value": {0: "batch", 2: TOTAL}}
        for s in KV_SETS:
            f = kv_feeds(s, 1, (1, 16))
            spec.sets[s.name] = {"input_ids": f["input_ids"], "attention_mask": f["attention_mask"],
                                 "past_key": f["past_key_values.0.key"], "past_value": f["past_key_values.0.value"]}
        return inner
    # plain: x [batch, sequence, 16]
    spec.input_names, spec.output_names = ["x"], ["y"]
    spec.ts_axes = {"x": {0: "batch", 1: "sequence"}, "y": {0: "batch", 1: "sequence"}}
    rng = np.random.default_rng(5)
    for name, b, t in (("seq6", 1, 6), ("seq9", 2, 9), ("seq16", 2, 16)):
        spec.sets[name] = {"x": rng.standard_normal((b, t, 16)).astype(np.float32)}
    return inner


def _dynamo_shapes(spec: Spec) -> dict:
    """torch.export dynamic shapes mirroring ts_axes; the total length is its own (derived) dim."""
    dims: dict[str, object] = {}  # torch.export.Dim per name, shared by every input that uses it

    def dim(name: str) -> object:
        if name == TOTAL:
            return torch.export.Dim.DYNAMIC
        if name not in dims:
            lo = 0 if name == "past_sequence" else 1
            dims[name] = torch.export.Dim(name, min=lo, max=60)
        return dims[name]

    def axes(name: str) -> dict:
        return {ax: dim(n) for ax, n in spec.ts_axes.get(name, {}).items()}

    if spec.kind not in ("decoder", "seq2seq"):
        return {name: axes(name) for name in spec.input_names}
    named = 4 if spec.kind == "seq2seq" else 2  # the forward's named arguments; the rest is *past
    shapes = {name: axes(name) for name in spec.input_names[:named]}
    shapes["past"] = tuple(axes(name) for name in spec.input_names[named:])
    return shapes


def _rename_total(model: onnx.ModelProto) -> None:
    """Name attention_mask's length as the dynamo exporter names the present length (it is that sum)."""
    am = [i for i in model.graph.input if i.name == "attention_mask"]
    if not am or len(am[0].type.tensor_type.shape.dim) < 2:
        return
    old = am[0].type.tensor_type.shape.dim[1].dim_param
    if not old or old == TOTAL or not any(i.name.startswith("past") for i in model.graph.input):
        return
    for vi in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param == old:
                d.dim_param = TOTAL


def export(spec: Spec, module: nn.Module, exporter: str, name: str) -> str:
    """Export at the prefill-with-past sizes (every dim > 1, so none is specialized) to models/NAME.onnx."""
    path = os.path.join(HERE, name + ".onnx")
    if os.path.exists(path):
        os.remove(path)
    export_set = spec.sets.get("prefill_past") or spec.sets.get("seq9")
    args = tuple(torch.from_numpy(export_set[n]) for n in spec.input_names)
    with torch.no_grad():
        if exporter == "torchscript":
            torch.onnx.export(module, args, path, dynamo=False, input_names=spec.input_names,
                              output_names=spec.output_names, dynamic_axes=spec.ts_axes, opset_version=TS_OPSET,
                              do_constant_folding=True)
        else:
            prog = torch.onnx.export(module, args, dynamo=True, input_names=spec.input_names,
                                     output_names=spec.output_names, dynamic_shapes=_dynamo_shapes(spec),
                                     opset_version=DYNAMO_OPSET, external_data=False, optimize=True)
            prog.save(path, external_data=False)
    model = _fix_ir(path)
    _rename_total(model)
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def _query_rows(feeds: dict[str, np.ndarray], out_len: int) -> np.ndarray | None:
    """[batch, seq] bool: query positions that are not padding (None when the model has no mask)."""
    am = feeds.get("attention_mask")
    return None if am is None else am[:, am.shape[1] - out_len:].astype(bool)


def verify(spec: Spec, module: nn.Module, path: str, tol: float = 1e-4) -> dict:
    """Compare onnxruntime with torch at every input set; padded query rows are compared only
    when they agree (torch and the exported graph may differ on rows that attend to nothing)."""
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}  # (TorchScript drops an input the trace never read)
    results = {}
    for set_name, feeds in spec.sets.items():
        with torch.no_grad():
            ref = module(*(torch.from_numpy(feeds[n]) for n in spec.input_names))
        ref = [r.numpy() for r in (ref if isinstance(ref, tuple) else (ref,))]
        got = sess.run(None, {k: v for k, v in feeds.items() if k in names})
        errs, rows_note = [], "all rows"
        for oname, g, r in zip(spec.output_names, got, ref):
            if g.shape != r.shape:
                raise AssertionError(f"{path}: {oname} shape {g.shape} != torch {r.shape} at {set_name}")
            close = np.isclose(g, r, rtol=tol, atol=tol)
            if not close.all() and oname == spec.output_names[0] and g.ndim >= 2:
                keep = _query_rows(feeds, g.shape[1])
                if keep is not None and close[keep].all():
                    rows_note = "non-padded query rows (padded rows differ)"
                    close = close[keep]
            if not close.all():
                raise AssertionError(f"{path}: {oname} differs from torch at {set_name}: "
                                     f"max abs err {float(np.abs(g - r).max())}")
            errs.append(float(np.abs(g - r).max()) if g.size else 0.0)
        results[set_name] = {"ok": True, "max_abs_err": max(errs), "compared": rows_note,
                             "shapes": {o: list(g.shape) for o, g in zip(spec.output_names, got)}}
    return results


def save_inputs(spec: Spec, name: str) -> None:
    """models/inputs/NAME/SET.npz: the exact feeds the export was verified with."""
    folder = os.path.join(INPUTS, name)
    os.makedirs(folder, exist_ok=True)
    for set_name, feeds in spec.sets.items():
        np.savez_compressed(os.path.join(folder, set_name + ".npz"), **feeds)


def specs() -> list[Spec]:
    hf = "transformers {}, tiny random {} (eager attention), flat KV cache through DynamicCache"
    return [
        Spec("gpt2_kv", hf.format("GPT2LMHeadModel", "GPT2Config"), gpt2, "decoder"),
        Spec("llama_kv", hf.format("LlamaForCausalLM", "LlamaConfig, GQA 2/1 heads"), llama, "decoder"),
        Spec("mistral_sw4_kv", hf.format("MistralForCausalLM", "MistralConfig sliding_window=4"), mistral_sw4,
             "decoder"),
        Spec("qwen2_mixed_sw4_kv", hf.format("Qwen2ForCausalLM", "Qwen2Config, layer 0 full / layer 1 sliding "
                                             "window 4"), qwen2_mixed_sw4, "decoder"),
        Spec("gemma2_sw4_kv", hf.format("Gemma2ForCausalLM", "Gemma2Config, alternating sliding window 4 / full, "
                                        "soft-capping"), gemma2_sw4, "decoder"),
        Spec("phi3_kv", hf.format("Phi3ForCausalLM", "Phi3Config"), phi3, "decoder"),
        Spec("gpt_neox_kv", hf.format("GPTNeoXForCausalLM", "GPTNeoXConfig"), gpt_neox, "decoder"),
        Spec("opt_kv", hf.format("OPTForCausalLM", "OPTConfig (positions from attention_mask cumsum)"), opt,
             "decoder"),
        Spec("bloom_kv", hf.format("BloomForCausalLM", "BloomConfig (alibi from attention_mask)"), bloom,
             "decoder"),
        Spec("t5_decoder_kv", "transformers T5ForConditionalGeneration decoder step, tiny random T5Config (8 relative "
             "buckets, max distance 16), self-attention cache flat, cross-attention from encoder_hidden_states",
             t5, "seq2seq"),
        Spec("clip_text", "transformers CLIPTextModel, tiny random CLIPTextConfig (causal mask + padding)",
             clip_text, "encoder"),
        Spec("sliced_double_causal", "causal mask built for 2*T with arange compare, sliced to [:T, :T], "
             "masked_fill(-inf)", SlicedDoubleCausal, "plain"),
        Spec("split_concat_tril", "stored 64x64 bool tril buffer split in row halves, concatenated, sliced "
             "[:T, :T], masked_fill(-inf)", SplitConcatStoredTril, "plain"),
        Spec("concat_causal_halves", "causal mask as torch.cat of rows [0, T//2) and [T//2, T), "
             "masked_fill(-inf)", ConcatCausalHalves, "plain"),
        Spec("stored_tril_past", "GPT-2 4.x style: stored 64x64 bool tril sliced [past:past+seq, :past+seq], "
             "Where(causal, scores, finfo.min) + padding, flat key/value cache", StoredTrilWithPast, "stored_kv"),
        Spec("concat_past_zeros", "transformers 4.3x _make_causal_mask: Concat(zeros [seq, past], causal "
             "square finfo.min/0 from masked_fill), Add to scores, + padding, flat key/value cache",
             ConcatPastZeros, "stored_kv"),
        Spec("trilu_past", "triu(full([seq, past+seq], finfo.min), diagonal=past+1) added to the scores, "
             "+ padding, flat key/value cache", TriluPast, "stored_kv"),
    ]



def record_failure(entry: dict, path: str, name: str, e: Exception) -> None:
    """A failed export in the log: its partial file removed, the error's first line kept, and the
    traceback printed (recorded, not hidden)."""
    if os.path.exists(path):
        os.remove(path)
    msg = str(e).strip().splitlines()
    entry.update(ok=False, error=f"{type(e).__name__}: {msg[0][:400] if msg else ''}")
    print(f"FAIL {name}: {entry['error']}", flush=True)
    traceback.print_exc(limit=3)


def main(argv: list[str]) -> int:
    """Export, verify and log every spec (or those whose name contains an argument)."""
    want = argv[1:]
    log = json.load(open(LOG)) if os.path.exists(LOG) else []
    for spec in specs():
        for exporter in ("torchscript", "dynamo"):
            name = f"{spec.base}_{'ts' if exporter == 'torchscript' else 'dynamo'}"
            if want and not any(w in name for w in want):
                continue
            entry = {"name": name, "file": name + ".onnx", "exporter": exporter, "source": spec.source}
            try:
                module = prepare(spec).eval()  # the exporter restores the mode it found
                path = export(spec, module, exporter, name)
                entry["verify"] = verify(spec, module, path)
                save_inputs(spec, name)
                m = onnx.load(path)
                entry.update(ok=True, bytes=os.path.getsize(path), ir_version=m.ir_version,
                             opset=[o.version for o in m.opset_import if o.domain in ("", "ai.onnx")][0],
                             input_sets=sorted(spec.sets))
                print(f"OK   {name}: {entry['bytes']} bytes")
            except Exception as e:  # recorded in the log, not hidden
                record_failure(entry, os.path.join(HERE, name + ".onnx"), name, e)
            log = [e for e in log if e["name"] != name] + [entry]
            with open(LOG, "w") as f:
                json.dump(sorted(log, key=lambda e: e["name"]), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
