"""Build the HELD-OUT set: tiny random-weight exports of architectures the corpus does not hold.

Run under the torch venv (torch 2.13.0, transformers 5.23.0, onnxscript; see make_kv_models.py):

    /work/torchenv/bin/python models/scripts/make_heldout.py [--out DIR] [NAME_SUBSTRING ...]

Same tools and wrappers as make_kv_models.py (flat KV cache through DynamicCache, TorchScript opset 17
and dynamo opset 18, verified against torch in onnxruntime at every input set), other families. Every
input set is saved as DIR/inputs/<model>/<set>.npz; DIR/heldout_log.json has per export ok/error.
Then the deployment variants of a few exports (no torch needed for these): float16
(onnxconverter-common), onnxruntime dynamic quantization, onnxruntime's transformer optimizer and
external data. The files stay out of the repository (models/heldout/ keeps only what a test needs);
measure them with models/scripts/heldout_report.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Callable

import numpy as np
import onnx
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_kv_models as kv
from make_kv_models import TOTAL, InputSet, Spec

warnings.filterwarnings("ignore")
DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "out", "heldout")  # (git ignores out/)
VOCAB = kv.VOCAB
# the corpus's sets plus one larger size (S = 64 with a past of 8)
kv.KV_SETS = (*kv.KV_SETS, InputSet("long", 1, 8, 64))
_SMALL = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=2, max_position_embeddings=256, attn_implementation="eager")
_IDS = dict(pad_token_id=0, bos_token_id=0, eos_token_id=0)


class DecoderNoCache(nn.Module):
    """A causal LM without a cache: (input_ids, attention_mask) -> logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                          return_dict=True).logits


# ---- the families ----------------------------------------------------------------------------
def qwen3() -> nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM
    return Qwen3ForCausalLM(Qwen3Config(num_key_value_heads=1, head_dim=16, **_SMALL))


def gemma3() -> nn.Module:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    return Gemma3ForCausalLM(Gemma3TextConfig(num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16,
                                              sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                                              **_IDS, **_SMALL))


def phi() -> nn.Module:
    from transformers import PhiConfig, PhiForCausalLM
    return PhiForCausalLM(PhiConfig(**_IDS, **_SMALL))


def falcon() -> nn.Module:
    from transformers import FalconConfig, FalconForCausalLM
    return FalconForCausalLM(FalconConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=2, new_decoder_architecture=False,
                                          multi_query=True, alibi=False, bos_token_id=0, eos_token_id=0,
                                          attn_implementation="eager"))


def gptj() -> nn.Module:
    from transformers import GPTJConfig, GPTJForCausalLM
    return GPTJForCausalLM(GPTJConfig(vocab_size=VOCAB, n_positions=256, n_embd=32, n_layer=2, n_head=2,
                                      rotary_dim=8, bos_token_id=0, eos_token_id=0, attn_implementation="eager"))


def gpt_bigcode() -> nn.Module:
    from transformers import GPTBigCodeConfig, GPTBigCodeForCausalLM
    return GPTBigCodeForCausalLM(GPTBigCodeConfig(vocab_size=VOCAB, n_positions=256, n_embd=32, n_layer=2,
                                                  n_head=2, multi_query=True, bos_token_id=0, eos_token_id=0,
                                                  attn_implementation="eager"))


def stablelm() -> nn.Module:
    from transformers import StableLmConfig, StableLmForCausalLM
    return StableLmForCausalLM(StableLmConfig(num_key_value_heads=1, **_IDS, **_SMALL))


def olmo() -> nn.Module:
    from transformers import OlmoConfig, OlmoForCausalLM
    return OlmoForCausalLM(OlmoConfig(num_key_value_heads=1, **_IDS, **_SMALL))


def bart() -> nn.Module:
    from transformers import BartConfig, BartForConditionalGeneration
    return BartForConditionalGeneration(BartConfig(vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=2,
                                                   encoder_attention_heads=2, decoder_attention_heads=2,
                                                   encoder_ffn_dim=64, decoder_ffn_dim=64,
                                                   max_position_embeddings=256, pad_token_id=1, bos_token_id=0,
                                                   eos_token_id=2, decoder_start_token_id=2,
                                                   attn_implementation="eager"))


def marian() -> nn.Module:
    from transformers import MarianConfig, MarianMTModel
    return MarianMTModel(MarianConfig(vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=2,
                                      encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                                      decoder_ffn_dim=64, max_position_embeddings=256, pad_token_id=1,
                                      eos_token_id=2, decoder_start_token_id=1, attn_implementation="eager"))


def whisper() -> nn.Module:
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    return WhisperForConditionalGeneration(WhisperConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8,
        max_source_positions=16, max_target_positions=256, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=0, suppress_tokens=[], begin_suppress_tokens=[], attn_implementation="eager"))


def mpt() -> nn.Module:
    from transformers import MptConfig, MptForCausalLM
    return MptForCausalLM(MptConfig(vocab_size=VOCAB, d_model=32, n_heads=2, n_layers=2, expansion_ratio=2,
                                    max_seq_len=256, attn_implementation="eager"))


def qwen3_sdpa() -> nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM
    return Qwen3ForCausalLM(Qwen3Config(num_key_value_heads=1, head_dim=16, **{**_SMALL, "attn_implementation": "sdpa"}))


def gemma3_nocache() -> nn.Module:
    return gemma3()


def specs() -> list[Spec]:
    hf = "transformers {} (tiny random config, eager attention){}"
    kvs = ", flat KV cache through DynamicCache"
    return [
        Spec("qwen3_kv", hf.format("Qwen3ForCausalLM", kvs), qwen3, "decoder"),
        Spec("gemma3_sw4_kv", hf.format("Gemma3ForCausalLM, sliding 4 / full", kvs), gemma3, "decoder"),
        Spec("phi_kv", hf.format("PhiForCausalLM", kvs), phi, "decoder"),
        Spec("falcon_kv", hf.format("FalconForCausalLM (multi-query, rotary)", kvs), falcon, "decoder"),
        Spec("gptj_kv", hf.format("GPTJForCausalLM", kvs), gptj, "decoder"),
        Spec("gpt_bigcode_kv", hf.format("GPTBigCodeForCausalLM (multi-query)", kvs), gpt_bigcode, "decoder"),
        Spec("stablelm_kv", hf.format("StableLmForCausalLM", kvs), stablelm, "decoder"),
        Spec("olmo_kv", hf.format("OlmoForCausalLM", kvs), olmo, "decoder"),
        Spec("bart_decoder_kv", hf.format("BartForConditionalGeneration decoder step", kvs), bart, "seq2seq"),
        Spec("marian_decoder_kv", hf.format("MarianMTModel decoder step", kvs), marian, "seq2seq"),
        Spec("whisper_decoder_kv", hf.format("WhisperForConditionalGeneration decoder step", kvs), whisper,
             "seq2seq"),
        Spec("qwen3_nocache", hf.format("Qwen3ForCausalLM", ", no cache"), qwen3, "nocache"),
        Spec("falcon_nocache", hf.format("FalconForCausalLM", ", no cache"), falcon, "nocache"),
        Spec("gptj_nocache", hf.format("GPTJForCausalLM", ", no cache"), gptj, "nocache"),
        Spec("mpt_kv", hf.format("MptForCausalLM (alibi)", kvs), mpt, "decoder"),
        Spec("qwen3_sdpa_kv", hf.format("Qwen3ForCausalLM, sdpa attention (the default)", kvs), qwen3_sdpa,
             "decoder"),
        Spec("qwen3_sdpa_nocache", hf.format("Qwen3ForCausalLM, sdpa attention", ", no cache"), qwen3_sdpa,
             "nocache"),
        Spec("gemma3_sw4_nocache", hf.format("Gemma3ForCausalLM, sliding 4 / full", ", no cache"), gemma3_nocache,
             "nocache"),
        # float16 from torch (onnxconverter-common's conversion of these exports does not load in
        # onnxruntime: the rotary embedding's Cast to float keeps a float16 value_info)
        Spec("qwen3_nocache_fp16", hf.format("Qwen3ForCausalLM", ", no cache, model.half()"),
             lambda: qwen3().half(), "nocache"),
    ]


# ---- export ----------------------------------------------------------------------------------
def prepare(spec: Spec) -> nn.Module:
    """make_kv_models.prepare, plus the no-cache kind (sets seq5, seq9, left_padded, long)."""
    if spec.kind != "nocache":
        return kv.prepare(spec)
    torch.manual_seed(0)
    module = DecoderNoCache(spec.build().eval())
    spec.input_names, spec.output_names = ["input_ids", "attention_mask"], ["logits"]
    spec.ts_axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
                    "logits": {0: "batch", 1: "sequence"}}
    rng = np.random.default_rng(3)
    for name, b, t, pad in (("seq5", 1, 5, 0), ("seq9", 2, 9, 0), ("left_padded", 2, 7, 3), ("long", 1, 96, 0)):
        mask = np.ones((b, t), np.int64)
        mask[0, :pad] = 0
        spec.sets[name] = {"input_ids": rng.integers(0, VOCAB, (b, t)).astype(np.int64), "attention_mask": mask}
    return module


def _dynamo_shapes(spec: Spec) -> dict:
    """make_kv_models._dynamo_shapes with room for the long set (max 512)."""
    dims: dict[str, object] = {}

    def dim(name: str) -> object:
        if name == TOTAL:
            return torch.export.Dim.DYNAMIC
        if name not in dims:
            dims[name] = torch.export.Dim(name, min=0 if name == "past_sequence" else 1, max=512)
        return dims[name]

    def axes(name: str) -> dict:
        return {ax: dim(n) for ax, n in spec.ts_axes.get(name, {}).items()}

    if spec.kind not in ("decoder", "seq2seq", "cachepos"):
        return {name: axes(name) for name in spec.input_names}
    named = sum(not n.startswith("past_key_values") for n in spec.input_names)  # (cache_position too)
    shapes = {name: axes(name) for name in spec.input_names[:named]}
    shapes["past"] = tuple(axes(name) for name in spec.input_names[named:])
    return shapes


def export(spec: Spec, module: nn.Module, exporter: str, path: str, opset: int | None = None,
           optimize: bool = True) -> None:
    export_set = spec.sets.get("prefill_past") or spec.sets["seq9"]
    args = tuple(torch.from_numpy(export_set[n]) for n in spec.input_names)
    with torch.no_grad():
        if exporter == "torchscript":
            torch.onnx.export(module, args, path, dynamo=False, input_names=spec.input_names,
                              output_names=spec.output_names, dynamic_axes=spec.ts_axes,
                              opset_version=kv.TS_OPSET, do_constant_folding=True)
        else:
            prog = torch.onnx.export(module, args, dynamo=True, input_names=spec.input_names,
                                     output_names=spec.output_names, dynamic_shapes=_dynamo_shapes(spec),
                                     opset_version=opset or kv.DYNAMO_OPSET, external_data=False, optimize=optimize)
            prog.save(path, external_data=False)
    model = kv._fix_ir(path)
    kv._rename_total(model)
    onnx.checker.check_model(model)
    onnx.save(model, path)


def save_inputs(sets: dict[str, dict[str, np.ndarray]], folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    for set_name, feeds in sets.items():
        np.savez_compressed(os.path.join(folder, set_name + ".npz"), **feeds)


# ---- deployment variants (onnx / onnxruntime only) --------------------------------------------
def _fp16(a: str, b: str) -> None:
    from onnxconverter_common import float16
    onnx.save(float16.convert_float_to_float16(onnx.load(a), keep_io_types=True), b)


def _int8(a: str, b: str) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic
    quantize_dynamic(a, b, weight_type=QuantType.QInt8)
    m = onnx.load(b)
    m.ir_version = min(m.ir_version, 10)
    onnx.save(m, b)


def _ortopt(level: int) -> Callable[[str, str], None]:
    def run(a: str, b: str) -> None:
        from onnxruntime.transformers import optimizer
        opt = optimizer.optimize_model(a, model_type="gpt2", num_heads=2, hidden_size=32, opt_level=level)
        opt.model.ir_version = min(opt.model.ir_version, 10)
        opt.save_model_to_file(b)
    return run


def _extsub(a: str, b: str) -> None:
    """One data file per tensor, in a subfolder next to the model."""
    m = onnx.load(a)
    sub = os.path.basename(b)[:-5] + "_data"
    os.makedirs(os.path.join(os.path.dirname(b), sub), exist_ok=True)
    onnx.external_data_helper.convert_model_to_external_data(m, all_tensors_to_one_file=False, size_threshold=256)
    for t in onnx.external_data_helper._get_all_tensors(m):
        for e in t.external_data:
            if e.key == "location":
                e.value = f"{sub}/{e.value}"
    onnx.save(m, b)


def _extdata(a: str, b: str) -> None:
    onnx.save(onnx.load(a), b, save_as_external_data=True, all_tensors_to_one_file=True,
              location=os.path.basename(b) + ".data", size_threshold=256)


def _optimum_names(a: str, b: str) -> None:
    """Optimum merged decoders name attention_mask's length like input_ids's (it is past + seq)."""
    m = onnx.load(a)
    dims = {i.name: i.type.tensor_type.shape.dim for i in m.graph.input}
    dims["attention_mask"][1].dim_param = dims["input_ids"][1].dim_param
    onnx.save(m, b)


# (suffix, what it is, converter, sources)
VARIANTS = [
    ("optnames", "attention_mask length named like input_ids's (Optimum)", _optimum_names,
     ("qwen3_kv_ts", "gemma3_sw4_kv_dynamo")),
    ("fp16", "onnxconverter-common float16 (keep_io_types)", _fp16, ("qwen3_kv_ts", "gemma3_sw4_kv_dynamo")),
    ("int8", "onnxruntime quantize_dynamic QInt8", _int8, ("qwen3_kv_ts", "gemma3_sw4_kv_dynamo")),
    ("ortopt", "onnxruntime.transformers.optimizer (gpt2, opt_level 1)", _ortopt(1),
     ("qwen3_kv_ts", "gemma3_sw4_kv_dynamo")),
    ("ortopt99", "onnxruntime.transformers.optimizer (gpt2, opt_level 99)", _ortopt(99),
     ("gpt_bigcode_kv_ts", "gpt_bigcode_kv_dynamo")),
    ("extsub", "external data, a file per tensor in a subfolder", _extsub, ("falcon_kv_dynamo",)),
    ("extdata", "onnx.save save_as_external_data, one file", _extdata, ("qwen3_kv_dynamo", "falcon_kv_ts")),
]


def variants(out: str, log: list[dict]) -> None:
    """The deployment variants of the exports in `out`; each reuses its source's input sets."""
    import shutil
    for suffix, how, convert, sources in VARIANTS:
        for source in sources:
            if not os.path.exists(os.path.join(out, source + ".onnx")):
                continue
            name = f"{source}_{suffix}"
            entry = {"name": name, "file": name + ".onnx", "source": f"{how} of {source}", "variant_of": source}
            try:
                convert(os.path.join(out, source + ".onnx"), os.path.join(out, name + ".onnx"))
                shutil.copytree(os.path.join(out, "inputs", source), os.path.join(out, "inputs", name),
                                dirs_exist_ok=True)
                entry.update(ok=True, bytes=os.path.getsize(os.path.join(out, name + ".onnx")))
                print(f"OK   {name}")
            except Exception as e:  # noqa: BLE001 (recorded, not hidden)
                entry.update(ok=False, error=f"{type(e).__name__}: {str(e).strip()[:400]}")
                print(f"FAIL {name}: {entry['error']}")
            log[:] = [e for e in log if e["name"] != name] + [entry]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--no-variants", action="store_true")
    ap.add_argument("want", nargs="*")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    log_path = os.path.join(args.out, "heldout_log.json")
    log = json.load(open(log_path)) if os.path.exists(log_path) else []
    for spec in specs():
        for exporter in ("torchscript", "dynamo"):
            name = f"{spec.base}_{'ts' if exporter == 'torchscript' else 'dynamo'}"
            if args.want and not any(w in name for w in args.want):
                continue
            path = os.path.join(args.out, name + ".onnx")
            entry = {"name": name, "file": name + ".onnx", "exporter": exporter, "source": spec.source}
            try:
                spec.sets.clear()
                module = prepare(spec).eval()
                export(spec, module, exporter, path)
                try:
                    entry["verify"] = kv.verify(spec, module, path)
                except AssertionError as e:  # float16: torch's CPU half kernels round differently
                    if "fp16" not in name:
                        raise
                    entry["verify_note"] = str(e)[:300]
                save_inputs(spec.sets, os.path.join(args.out, "inputs", name))
                entry.update(ok=True, bytes=os.path.getsize(path), input_sets=sorted(spec.sets))
                print(f"OK   {name}: {entry['bytes']} bytes", flush=True)
            except Exception as e:  # noqa: BLE001 (recorded, not hidden)
                kv.record_failure(entry, path, name, e)
            log = [e for e in log if e["name"] != name] + [entry]
            with open(log_path, "w") as f:
                json.dump(sorted(log, key=lambda e: e["name"]), f, indent=1)
    if not args.no_variants:
        variants(args.out, log)
        with open(log_path, "w") as f:
            json.dump(sorted(log, key=lambda e: e["name"]), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
