"""Build the corpus of real exported ONNX models in models/*.onnx.

Run under a separate virtualenv that has torch (the project's own venv and its tests never
need torch; they use only the committed .onnx files):

    python3 -m venv /work/torchenv
    /work/torchenv/bin/pip install torch==2.13.0
    /work/torchenv/bin/pip install transformers onnx onnxscript onnxruntime numpy
    /work/torchenv/bin/python models/make_models.py [NAME_SUBSTRING ...]

Every model is tiny (random weights, seeded; transformers models are built from small configs,
never downloaded), exported with the TorchScript exporter (dynamo=False) and/or the dynamo exporter
(dynamo=True), saved with IR version 10 (onnxruntime 1.31 rejects newer IR) and checked against the
torch output in onnxruntime, at two sequence lengths where the model has a dynamic sequence axis.

Exports that fail are recorded in models/export_log.json (name, exporter, error) and summarized in
models/README.md by hand.
"""

from __future__ import annotations

import json
import math
import os
import sys
import traceback
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
TS_OPSET = 17
DYNAMO_OPSET = 18
MAX_IR = 10

warnings.filterwarnings("ignore")


# --------------------------------------------------------------------------------------------
# export helpers
# --------------------------------------------------------------------------------------------

def _fix_ir(path: str) -> onnx.ModelProto:
    model = onnx.load(path)
    if model.ir_version > MAX_IR:
        model.ir_version = MAX_IR
    # onnx.save keeps everything in one file (all models here are far below 2 GB)
    onnx.save(model, path)
    onnx.checker.check_model(model)
    return model


def export(module: nn.Module, args: tuple, name: str, exporter: str, input_names, output_names,
           dyn: dict[str, dict[int, str]] | None, max_dims: dict[str, int] | None = None) -> str:
    """Export `module` to models/<name>.onnx. dyn maps input/output name -> {axis: symbolic name}."""
    module.eval()
    path = os.path.join(HERE, name + ".onnx")
    if os.path.exists(path):
        os.remove(path)
    with torch.no_grad():
        if exporter == "torchscript":
            torch.onnx.export(module, args, path, dynamo=False, input_names=input_names,
                              output_names=output_names, dynamic_axes=dyn or None,
                              opset_version=TS_OPSET, do_constant_folding=True)
        elif exporter == "dynamo":
            dynamic_shapes = None
            if dyn:
                dims: dict[str, torch.export.Dim] = {}
                dynamic_shapes = {}
                for iname in input_names:
                    axes = dyn.get(iname, {})
                    spec = {}
                    for ax, sym in axes.items():
                        if sym not in dims:
                            mx = (max_dims or {}).get(sym)
                            dims[sym] = torch.export.Dim(sym, min=2, max=mx) if mx else torch.export.Dim(sym, min=2)
                        spec[ax] = dims[sym]
                    dynamic_shapes[iname] = spec
            prog = torch.onnx.export(module, args, dynamo=True, input_names=input_names,
                                     output_names=output_names, dynamic_shapes=dynamic_shapes,
                                     opset_version=DYNAMO_OPSET, external_data=False, optimize=True)
            prog.save(path, external_data=False)
        else:
            raise ValueError(exporter)
    _fix_ir(path)
    return path


def verify(module: nn.Module, path: str, make_inputs, lengths) -> list[dict]:
    """Run the ONNX file in onnxruntime for each length and compare with torch."""
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    out = []
    for n in lengths:
        inputs = make_inputs(n)
        with torch.no_grad():
            ref = module(*inputs)
        if isinstance(ref, (tuple, list)):
            ref = ref[0]
        feeds = {k: v.numpy() for k, v in zip(names, inputs)}
        got = sess.run(None, feeds)[0]
        ref = ref.numpy()
        ok = got.shape == ref.shape and np.allclose(got, ref, rtol=1e-4, atol=1e-4, equal_nan=True)
        out.append({"length": n, "shape": list(got.shape), "ok": bool(ok),
                    "max_abs_err": float(np.nanmax(np.abs(np.nan_to_num(got - ref, posinf=0, neginf=0))))
                    if got.shape == ref.shape else None})
        if not ok:
            raise AssertionError(f"{path}: onnxruntime output differs from torch at length {n}: {out[-1]}")
    return out


# --------------------------------------------------------------------------------------------
# transformers models (tiny random configs; never from_pretrained)
# --------------------------------------------------------------------------------------------

class HFWrap(nn.Module):
    """input_ids + attention_mask -> logits / last_hidden_state (no cache)."""

    def __init__(self, m, lm: bool = True):
        super().__init__()
        self.m = m
        self.lm = lm

    def forward(self, input_ids, attention_mask):
        kw = dict(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)
        if self.lm:
            kw["use_cache"] = False
        return self.m(**kw)[0]


def _hf_inputs(vocab):
    def make(n, b=2):
        g = torch.Generator().manual_seed(n)
        ids = torch.randint(0, vocab, (b, n), generator=g)
        return (ids, torch.ones(b, n, dtype=torch.int64))
    return make


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=100, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                     attn_implementation="eager")
    return HFWrap(GPT2LMHeadModel(cfg)), cfg


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                      attn_implementation="eager")
    return HFWrap(LlamaForCausalLM(cfg)), cfg


def mistral():
    from transformers import MistralConfig, MistralForCausalLM
    cfg = MistralConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                        sliding_window=4, attn_implementation="eager")
    return HFWrap(MistralForCausalLM(cfg)), cfg


def bert():
    from transformers import BertConfig, BertModel
    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64, attn_implementation="eager")
    return HFWrap(BertModel(cfg, add_pooling_layer=False), lm=False), cfg


# --------------------------------------------------------------------------------------------
# hand-written torch modules mimicking common mask idioms
# --------------------------------------------------------------------------------------------

class NanoGPTAttention(nn.Module):
    """nanoGPT's CausalSelfAttention (the non-flash path) with its stored tril buffer."""

    def __init__(self, n_embd=32, n_head=2, block_size=64):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head
        self.n_embd = n_embd
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size))
                             .view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class NanoGPT(nn.Module):
    def __init__(self, vocab=100, n_embd=32, block_size=64):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.ln = nn.LayerNorm(n_embd)
        self.attn = NanoGPTAttention(n_embd, 2, block_size)
        self.head = nn.Linear(n_embd, vocab, bias=False)

    def forward(self, idx):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        x = x + self.attn(self.ln(x))
        return self.head(x)


class TriluOffsets(nn.Module):
    """torch.triu / torch.tril with offsets, on generated ones/full tensors and on the input."""

    def forward(self, x):  # x: [B, N, M]
        n, m = x.shape[-2], x.shape[-1]
        a = torch.triu(x, 1)                                   # upper, k=1, on the input
        b = torch.tril(torch.ones(n, m, dtype=x.dtype), -2)    # lower, k=-2, 0/1 generator
        c = torch.triu(torch.full((n, m), 2.0, dtype=x.dtype), 3)  # upper, k=3, 0/2 generator
        d = torch.tril(x, 2)                                   # lower, k=2, on the input
        return a + b * x + c - d


class BandAttention(nn.Module):
    """Local attention: keep |j - i| <= w, built from arange and applied with masked_fill."""

    def __init__(self, d=16, w=2):
        super().__init__()
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.w = w

    def forward(self, x):  # [B, T, d]
        T = x.shape[1]
        i = torch.arange(T, device=x.device).unsqueeze(1)
        j = torch.arange(T, device=x.device).unsqueeze(0)
        band = (j - i).abs() <= self.w
        att = self.q(x) @ self.k(x).transpose(-2, -1) / math.sqrt(x.shape[-1])
        att = att.masked_fill(~band, float("-inf"))
        return F.softmax(att, dim=-1) @ self.v(x)


class EyeDynamic(nn.Module):
    def forward(self, x):  # [B, N, N]
        n = x.shape[-1]
        return x + torch.eye(n, dtype=x.dtype)


class EyeStatic(nn.Module):
    def __init__(self, n=8):
        super().__init__()
        self.n = n

    def forward(self, x):  # [B, 8, 8]
        return x @ (torch.eye(self.n) * 3.0) + torch.eye(self.n)


class TorchTransformerDecoder(nn.Module):
    """nn.TransformerDecoderLayer with nn.Transformer.generate_square_subsequent_mask as tgt_mask."""

    def __init__(self, d=32, nhead=2):
        super().__init__()
        self.layer = nn.TransformerDecoderLayer(d, nhead, dim_feedforward=64, dropout=0.0,
                                                batch_first=True)

    def forward(self, tgt, memory):
        sz = tgt.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(sz, device=tgt.device, dtype=tgt.dtype)
        return self.layer(tgt, memory, tgt_mask=mask)


class ConstCausal(nn.Module):
    """Single-head attention with a stored constant causal mask (-10000 above the diagonal)."""

    def __init__(self, T=256, d=16, fill=-10000.0):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.d = d
        mask = torch.triu(torch.full((T, T), fill), diagonal=1)
        self.register_buffer("causal_mask", mask)

    def forward(self, x):  # [B, T, d], static T
        q, k, v = self.qkv(x).split(self.d, dim=-1)
        att = q @ k.transpose(-2, -1) / math.sqrt(self.d) + self.causal_mask
        return F.softmax(att, dim=-1) @ v


class FoldedCausal(nn.Module):
    """Static-shape attention whose -inf causal mask is computed with triu and constant-folded."""

    def __init__(self, T=64, d=16):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.d = d
        self.T = T

    def forward(self, x):
        q, k, v = self.qkv(x).split(self.d, dim=-1)
        mask = torch.triu(torch.full((self.T, self.T), float("-inf")), diagonal=1)
        att = q @ k.transpose(-2, -1) / math.sqrt(self.d) + mask
        return F.softmax(att, dim=-1) @ v


# --------------------------------------------------------------------------------------------
# the corpus
# --------------------------------------------------------------------------------------------

def _randn(*shape_fn):
    def make(n):
        g = torch.Generator().manual_seed(n)
        return tuple(torch.randn(*s(n), generator=g) for s in shape_fn)
    return make


def specs():
    """(base name, builder, make_inputs, input_names, output_names, dyn axes, lengths, exporters, source, max_dims)"""
    hf_dyn = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
              "out": {0: "batch", 1: "sequence"}}
    both = ("torchscript", "dynamo")
    S = []
    for base, fn, src in [("gpt2", gpt2, "transformers GPT2LMHeadModel, tiny random GPT2Config (eager attention)"),
                          ("llama", llama, "transformers LlamaForCausalLM, tiny random LlamaConfig (eager attention)"),
                          ("mistral_sw4", mistral, "transformers MistralForCausalLM, tiny random MistralConfig, sliding_window=4, eager attention"),
                          ("bert", bert, "transformers BertModel (no pooler), tiny random BertConfig (eager attention)")]:
        S.append(dict(base=base, build=lambda fn=fn: fn()[0], make=_hf_inputs(100),
                      inputs=["input_ids", "attention_mask"], outputs=["out"], dyn=hf_dyn,
                      lengths=(7, 12), exporters=both, source=src, max_dims={"sequence": 64}))
    S.append(dict(base="nanogpt", build=lambda: NanoGPT(), make=lambda n: (torch.randint(0, 100, (2, n), generator=torch.Generator().manual_seed(n)),),
                  inputs=["idx"], outputs=["logits"], dyn={"idx": {0: "batch", 1: "sequence"}, "logits": {0: "batch", 1: "sequence"}},
                  lengths=(7, 12), exporters=both, source="nanoGPT-style CausalSelfAttention with tril buffer (block_size 64), masked_fill(bias[:,:,:T,:T]==0, -inf)",
                  max_dims={"sequence": 64}))
    S.append(dict(base="nanogpt_static16", build=lambda: NanoGPT(), make=lambda n: (torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(1)),),
                  inputs=["idx"], outputs=["logits"], dyn=None, lengths=(16,), exporters=both,
                  source="nanoGPT-style model exported at fixed T=16 so the sliced tril buffer is constant-folded"))
    S.append(dict(base="trilu_offsets", build=lambda: TriluOffsets(), make=_randn(lambda n: (2, n, n + 3)),
                  inputs=["x"], outputs=["y"], dyn={"x": {0: "batch", 1: "rows", 2: "cols"}, "y": {0: "batch", 1: "rows", 2: "cols"}},
                  lengths=(6, 9), exporters=both, source="torch.triu(x,1), torch.tril(ones,-2)*x, torch.triu(full(2.0),3), torch.tril(x,2)"))
    S.append(dict(base="band_w2", build=lambda: BandAttention(), make=_randn(lambda n: (2, n, 16)),
                  inputs=["x"], outputs=["y"], dyn={"x": {0: "batch", 1: "sequence"}, "y": {0: "batch", 1: "sequence"}},
                  lengths=(7, 12), exporters=both, source="local attention: (arange j - arange i).abs() <= 2 via masked_fill(~band, -inf)"))
    S.append(dict(base="eye_dynamic", build=lambda: EyeDynamic(), make=_randn(lambda n: (2, n, n)),
                  inputs=["x"], outputs=["y"], dyn={"x": {0: "batch", 1: "n", 2: "n"}, "y": {0: "batch", 1: "n", 2: "n"}},
                  lengths=(5, 9), exporters=both, source="x + torch.eye(n), n from the input shape"))
    S.append(dict(base="eye_static8", build=lambda: EyeStatic(), make=_randn(lambda n: (2, 8, 8)),
                  inputs=["x"], outputs=["y"], dyn=None, lengths=(8,), exporters=both,
                  source="x @ (torch.eye(8)*3) + torch.eye(8), static shape (eye constant-folded)"))
    S.append(dict(base="torch_transformer_decoder", build=lambda: TorchTransformerDecoder(),
                  make=_randn(lambda n: (2, n, 32), lambda n: (2, 5, 32)),
                  inputs=["tgt", "memory"], outputs=["y"],
                  dyn={"tgt": {0: "batch", 1: "tgt_len"}, "memory": {0: "batch", 1: "mem_len"}, "y": {0: "batch", 1: "tgt_len"}},
                  lengths=(6, 10), exporters=both,
                  source="nn.TransformerDecoderLayer with tgt_mask=nn.Transformer.generate_square_subsequent_mask(tgt_len)"))
    # The TorchScript exporter bakes the traced tgt_len into a Reshape inside
    # F.multi_head_attention_forward (the dynamic-axes export fails in onnxruntime at another length),
    # so the TorchScript file of this model is a static-shape one: its mask is constant-folded.
    S.append(dict(base="torch_transformer_decoder_static8", build=lambda: TorchTransformerDecoder(),
                  make=_randn(lambda n: (2, 8, 32), lambda n: (2, 5, 32)),
                  inputs=["tgt", "memory"], outputs=["y"], dyn=None, lengths=(8,), exporters=("torchscript",),
                  source="nn.TransformerDecoderLayer with tgt_mask=generate_square_subsequent_mask(8), static shapes"))
    S.append(dict(base="const_causal256", build=lambda: ConstCausal(), make=_randn(lambda n: (1, 256, 16)),
                  inputs=["x"], outputs=["y"], dyn=None, lengths=(256,), exporters=both,
                  source="attention + stored 256x256 float32 buffer triu(full(-10000),1) (0 on/below diagonal)"))
    S.append(dict(base="folded_causal64", build=lambda: FoldedCausal(), make=_randn(lambda n: (2, 64, 16)),
                  inputs=["x"], outputs=["y"], dyn=None, lengths=(64,), exporters=both,
                  source="attention + triu(full(-inf),1) at static T=64, constant-folded by the exporter"))
    return S


def main(argv):
    want = argv[1:]
    log = []
    for spec in specs():
        for exporter in spec["exporters"]:
            name = f"{spec['base']}_{'ts' if exporter == 'torchscript' else 'dynamo'}"
            if want and not any(w in name for w in want):
                continue
            torch.manual_seed(0)
            module = spec["build"]().eval()
            args = spec["make"](spec["lengths"][0])
            entry = {"name": name, "file": name + ".onnx", "exporter": exporter, "source": spec["source"],
                     "inputs": spec["inputs"], "dynamic_axes": spec["dyn"]}
            try:
                path = export(module, args, name, exporter, spec["inputs"], spec["outputs"], spec["dyn"],
                              spec.get("max_dims"))
                entry["verify"] = verify(module, path, spec["make"], spec["lengths"])
                m = onnx.load(path)
                entry["bytes"] = os.path.getsize(path)
                entry["opset"] = [o.version for o in m.opset_import if o.domain in ("", "ai.onnx")][0]
                entry["ir_version"] = m.ir_version
                entry["ok"] = True
                print(f"OK   {name}: {entry['bytes']} bytes, opset {entry['opset']}")
            except Exception as e:  # record and go on
                p = os.path.join(HERE, name + ".onnx")
                if os.path.exists(p):
                    os.remove(p)
                entry["ok"] = False
                entry["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:400] if str(e) else ''}"
                print(f"FAIL {name}: {entry['error']}")
                traceback.print_exc(limit=2)
            log.append(entry)
    logpath = os.path.join(HERE, "export_log.json")
    old = []
    if want and os.path.exists(logpath):
        old = [e for e in json.load(open(logpath)) if e["name"] not in {x["name"] for x in log}]
    import transformers
    meta = {"torch": torch.__version__, "transformers": transformers.__version__, "onnx": onnx.__version__,
            "onnxruntime": ort.__version__}
    allents = sorted(old + log, key=lambda e: e["name"])
    with open(logpath, "w") as f:
        json.dump(allents, f, indent=1)
    with open(os.path.join(HERE, "versions.json"), "w") as f:
        json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main(sys.argv)
