"""Build HELD-OUT round 3: the deployed kinds rounds 1 and 2 (make_heldout*.py) did not cover.

Three parts, each in the venv that has its tools (no weights downloaded: configs built in code):

    /work/scratch/torchvenv/bin/python models/scripts/make_heldout3.py torch [--out DIR] [WANT ...]
        transformers 5.x (current masking_utils) through both torch exporters: SDPA attention in
        llama, mistral (sliding 4), gemma3 (sliding 4 / global; transformers 5 refuses sdpa for
        gemma2), phi3 (sliding 4), qwen2, eager phi3 with a sliding window, a no-cache llama; dim
        naming: TorchScript `dynamic_axes` naming attention_mask's length like input_ids's (it is
        past + seq at run time; `collide`), the same renamed globally to "past_sequence + sequence"
        as make_kv_models does (input_ids' length then claims the sum; `sumnamed`), dynamo with
        `Dim.AUTO` everywhere; T5EncoderModel; a tiny ViT with a stored band and a torch.eye; tril/triu of data
        with a run-time diagonal (from shapes); a larger llama (hidden 256) for external data.
    /work/scratch/optimumvenv/bin/python models/scripts/make_heldout3.py optimum [--out DIR]
        Optimum's exporter (make_heldout2.optimum_part) on mistral (sliding 4), phi3 and gemma:
        model.onnx, decoder_model and Optimum's merged decoder.
    <project venv> models/scripts/make_heldout3.py variants [--out DIR]
        onnxruntime quantize_static (QDQ, calibrated on the saved input sets) of two decoders, and
        the larger llama saved with external data in one file.

Input sets are saved as DIR/inputs/<model>/<set>.npz, so models/scripts/heldout_report.py DIR
measures them. The files stay out of git (out/ is ignored).
"""

from __future__ import annotations

import os
import shutil
import sys
import traceback
import warnings

import numpy as np
import onnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
warnings.filterwarnings("ignore")
DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "out", "heldout3")
VOCAB = 100


# ---- 1. transformers 5.x through both torch exporters ------------------------------------------
def torch_part(out: str, want: list[str], log: list[dict]) -> None:
    import make_heldout as h1
    import make_kv_models as kv
    import torch
    import torch.nn as nn
    from make_kv_models import Spec

    small = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                 pad_token_id=0, bos_token_id=0, eos_token_id=0)

    def sdpa(**kw: object) -> dict:
        return {**small, "attn_implementation": "sdpa", **kw}

    def llama() -> nn.Module:
        from transformers import LlamaConfig, LlamaForCausalLM
        return LlamaForCausalLM(LlamaConfig(**sdpa()))

    def llama_big() -> nn.Module:
        from transformers import LlamaConfig, LlamaForCausalLM
        return LlamaForCausalLM(LlamaConfig(**sdpa(hidden_size=256, intermediate_size=512, vocab_size=2000,
                                                   num_attention_heads=4, num_key_value_heads=2)))

    def mistral() -> nn.Module:
        from transformers import MistralConfig, MistralForCausalLM
        return MistralForCausalLM(MistralConfig(**sdpa(sliding_window=4)))

    def gemma3() -> nn.Module:  # (transformers 5 refuses sdpa for Gemma2ForCausalLM)
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig
        return Gemma3ForCausalLM(Gemma3TextConfig(**sdpa(head_dim=16, query_pre_attn_scalar=16, sliding_window=4,
                                                          layer_types=["sliding_attention", "full_attention"])))

    def phi3(impl: str) -> nn.Module:
        from transformers import Phi3Config, Phi3ForCausalLM
        return Phi3ForCausalLM(Phi3Config(**sdpa(sliding_window=4, attn_implementation=impl)))

    def qwen2() -> nn.Module:
        from transformers import Qwen2Config, Qwen2ForCausalLM
        return Qwen2ForCausalLM(Qwen2Config(**sdpa()))

    def t5_encoder() -> nn.Module:
        from transformers import T5Config, T5EncoderModel
        return T5EncoderModel(T5Config(vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2,
                                       pad_token_id=0, eos_token_id=1, decoder_start_token_id=0))

    class LocalViT(nn.Module):
        """4x4 patches of a 16x16 image (16 tokens), one attention layer that sees a stored band
        (|i - j| <= 2) and leaves itself out with torch.eye(16)."""

        def __init__(self) -> None:
            super().__init__()
            self.patch = nn.Conv2d(3, 16, 4, 4)
            self.qkv = nn.Linear(16, 48)
            i = torch.arange(16)
            self.register_buffer("band", (i[:, None] - i[None, :]).abs() <= 2, persistent=False)

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            x = self.patch(pixel_values).flatten(2).transpose(1, 2)
            q, k, v = self.qkv(x).chunk(3, -1)
            s = q @ k.transpose(-1, -2) / 4 - 1e4 * torch.eye(16)
            return s.masked_fill(~self.band, float("-inf")).softmax(-1) @ v

    class TriluData(nn.Module):
        """tril / triu of data (not a mask) with diagonals read off the shapes at run time."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            m, n = x.shape[-2], x.shape[-1]
            g = x @ x.transpose(-1, -2)
            return torch.tril(x, diagonal=n - m) + torch.triu(g, diagonal=1) @ x

    hf = "transformers {} (tiny random config, {} attention){}"
    kvs = ", flat KV cache through DynamicCache"
    specs = [
        Spec("llama_sdpa_kv", hf.format("LlamaForCausalLM", "sdpa", kvs), llama, "decoder"),
        Spec("mistral_sw4_sdpa_kv", hf.format("MistralForCausalLM sliding 4", "sdpa", kvs), mistral, "decoder"),
        Spec("gemma3_sw4_sdpa_kv", hf.format("Gemma3ForCausalLM sliding 4 / global", "sdpa", kvs), gemma3,
             "decoder"),
        Spec("phi3_sw4_sdpa_kv", hf.format("Phi3ForCausalLM sliding 4", "sdpa", kvs), lambda: phi3("sdpa"),
             "decoder"),
        Spec("phi3_sw4_eager_kv", hf.format("Phi3ForCausalLM sliding 4", "eager", kvs), lambda: phi3("eager"),
             "decoder"),
        Spec("qwen2_sdpa_kv", hf.format("Qwen2ForCausalLM", "sdpa", kvs), qwen2, "decoder"),
        Spec("llama_sdpa_nocache", hf.format("LlamaForCausalLM", "sdpa", ", no cache"), llama, "nocache"),
        Spec("llama_big_sdpa_kv", hf.format("LlamaForCausalLM hidden 256, vocab 2000", "sdpa", kvs), llama_big,
             "decoder"),
        Spec("t5_encoder", "transformers T5EncoderModel (tiny random config; relative position buckets, "
             "right padding)", t5_encoder, "encoder"),
        Spec("vit_local", LocalViT.__doc__ or "", LocalViT, "vision"),
        Spec("trilu_data", TriluData.__doc__ or "", TriluData, "plain"),
    ]
    # (name suffix, exporter, how dims are named)
    kinds = [("ts", "torchscript", "names"), ("dynamo", "dynamo", "names"),
             ("ts_collide", "torchscript", "collide"), ("ts_sumnamed", "torchscript", "sumnamed"),
             ("dynamo_auto", "dynamo", "auto")]
    only_named = {"llama_sdpa_kv", "gemma3_sw4_sdpa_kv"}  # the naming variants: two models
    for spec in specs:
        for suffix, exporter, naming in kinds:
            if naming != "names" and spec.base not in only_named:
                continue
            if spec.base == "llama_big_sdpa_kv" and exporter != "torchscript":
                continue
            name = f"{spec.base}_{suffix}"
            if want and not any(w in name for w in want):
                continue
            path = os.path.join(out, name + ".onnx")
            entry = {"name": name, "file": name + ".onnx", "exporter": exporter, "naming": naming,
                     "source": spec.source}
            try:
                spec.sets.clear()
                if spec.kind == "vision":
                    torch.manual_seed(0)
                    module = spec.build().eval()
                    spec.input_names, spec.output_names = ["pixel_values"], ["y"]
                    spec.ts_axes = {"pixel_values": {0: "batch"}, "y": {0: "batch"}}
                    rng = np.random.default_rng(9)
                    spec.sets.update({f"b{b}": {"pixel_values": rng.standard_normal((b, 3, 16, 16)).astype(
                        np.float32)} for b in (1, 2, 3)})
                    spec.sets["seq9"] = spec.sets["b2"]  # h1.export's example set
                else:
                    module = h1.prepare(spec).eval()
                if spec.kind == "plain":  # rectangular too: tril's diagonal n - m moves
                    rng = np.random.default_rng(11)
                    spec.ts_axes = {"x": {0: "batch", 1: "rows", 2: "cols"}, "y": {0: "batch", 1: "rows", 2: "cols"}}
                    spec.sets.clear()
                    spec.sets.update({f"r{m}c{n}": {"x": (rng.standard_normal((2, m, n)) * 0.3).astype(np.float32)}
                                      for m, n in ((6, 6), (9, 9), (4, 7), (7, 5), (16, 16))})
                    spec.sets["seq9"] = spec.sets["r9c9"]
                if naming in ("collide", "sumnamed"):  # sumnamed: then renamed as the corpus does
                    spec.ts_axes["attention_mask"] = {0: "batch", 1: "sequence"}
                if naming == "auto":
                    _export_auto(spec, module, path, kv)
                else:  # (the corpus renames attention_mask's dim to the sum: not when it collides)
                    rename, kv._rename_total = kv._rename_total, (lambda m: None) if naming == "collide" \
                        else kv._rename_total
                    try:
                        h1.export(spec, module, exporter, path)
                    finally:
                        kv._rename_total = rename
                entry["verify"] = kv.verify(spec, module, path)
                if spec.kind in ("vision", "plain"):
                    spec.sets.pop("seq9", None)
                h1.save_inputs(spec.sets, os.path.join(out, "inputs", name))
                entry.update(ok=True, bytes=os.path.getsize(path), input_sets=sorted(spec.sets))
                print(f"OK   {name}: {entry['bytes']} bytes", flush=True)
            except Exception as e:  # noqa: BLE001 (recorded, not hidden)
                kv.record_failure(entry, path, name, e)
            log[:] = [e for e in log if e["name"] != name] + [entry]


def _export_auto(spec: object, module: object, path: str, kv: object) -> None:
    """The dynamo exporter with Dim.AUTO on every named axis: torch names the dims itself."""
    import torch
    auto = torch.export.Dim.AUTO
    export_set = spec.sets.get("prefill_past") or spec.sets["seq9"]
    args = tuple(torch.from_numpy(export_set[n]) for n in spec.input_names)
    named = 2
    shapes = {n: {ax: auto for ax in spec.ts_axes.get(n, {})} for n in spec.input_names[:named]}
    shapes["past"] = tuple({ax: auto for ax in spec.ts_axes.get(n, {})} for n in spec.input_names[named:])
    with torch.no_grad():
        prog = torch.onnx.export(module, args, dynamo=True, input_names=spec.input_names,
                                 output_names=spec.output_names, dynamic_shapes=shapes,
                                 opset_version=kv.DYNAMO_OPSET, external_data=False, optimize=True)
        prog.save(path, external_data=False)
    model = kv._fix_ir(path)
    onnx.checker.check_model(model)
    onnx.save(model, path)


# ---- 2. Optimum's exporter on other families ----------------------------------------------------
def optimum_part(out: str, want: list[str], log: list[dict]) -> None:
    import make_heldout2 as h2

    def models() -> dict:
        from transformers import GemmaConfig, GemmaForCausalLM, MistralConfig, MistralForCausalLM, Phi3Config, Phi3ForCausalLM
        small = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256, pad_token_id=0,
                     bos_token_id=0, eos_token_id=0)
        return {
            "mistral_sw4": (lambda: MistralForCausalLM(MistralConfig(sliding_window=4, **small)), "decoder"),
            "phi3": (lambda: Phi3ForCausalLM(Phi3Config(**small)), "decoder"),
            "gemma": (lambda: GemmaForCausalLM(GemmaConfig(head_dim=16, **small)), "decoder"),
        }

    agree = h2._agree

    def recorded(a: str, b: str, sets_dir: str, atol: float = 1e-4) -> dict:
        """mistral's merged decoder returns a present of another length than model.onnx's: logged."""
        try:
            return agree(a, b, sets_dir, atol)
        except (AssertionError, ValueError) as e:
            print(f"DIFFERS {os.path.basename(a)}: {e}", flush=True)
            return {"differs": str(e)[:300]}

    h2._hf_models, h2._agree = models, recorded
    h2.optimum_part(out, want, log)


# ---- 3. QDQ static quantization, external data -------------------------------------------------
def calibration_reader(sets: str):  # type: ignore[no-untyped-def]
    """quantize_static's calibration data: every input set saved in the folder `sets`, in name order."""
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter([dict(np.load(os.path.join(sets, f))) for f in sorted(os.listdir(sets))])

        def get_next(self) -> dict | None:
            return next(self.feeds, None)
    return Reader()


def _qdq(a: str, b: str, sets: str) -> None:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = b + ".pre.onnx"
    quant_pre_process(a, pre, skip_symbolic_shape=True)
    quantize_static(pre, b, calibration_reader(sets), quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Gemm", "Conv"])
    os.remove(pre)
    m = onnx.load(b)
    m.ir_version = min(m.ir_version, 10)
    onnx.save(m, b)


def _extdata(a: str, b: str, sets: str) -> None:
    onnx.save(onnx.load(a), b, save_as_external_data=True, all_tensors_to_one_file=True,
              location=os.path.basename(b) + ".data", size_threshold=1024)


VARIANTS = [("qdq", "onnxruntime quantize_static QDQ (MatMul/Gemm, u8/s8, calibrated on the input sets)", _qdq,
             ("llama_sdpa_kv_ts", "gemma3_sw4_sdpa_kv_dynamo")),
            ("extdata", "onnx.save save_as_external_data, one file", _extdata, ("llama_big_sdpa_kv_ts",))]


def variants_part(out: str, want: list[str], log: list[dict]) -> None:
    for suffix, how, convert, sources in VARIANTS:
        for source in sources:
            name = f"{source}_{suffix}"
            if want and not any(w in name for w in want) or not os.path.exists(os.path.join(out, source + ".onnx")):
                continue
            entry = {"name": name, "file": name + ".onnx", "source": f"{how} of {source}", "variant_of": source}
            try:
                sets = os.path.join(out, "inputs", source)
                convert(os.path.join(out, source + ".onnx"), os.path.join(out, name + ".onnx"), sets)
                shutil.copytree(sets, os.path.join(out, "inputs", name), dirs_exist_ok=True)
                entry.update(ok=True, bytes=os.path.getsize(os.path.join(out, name + ".onnx")))
                print(f"OK   {name}", flush=True)
            except Exception as e:  # noqa: BLE001 (recorded, not hidden)
                entry.update(ok=False, error=f"{type(e).__name__}: {str(e).strip()[:400]}")
                print(f"FAIL {name}: {entry['error']}", flush=True)
                traceback.print_exc(limit=3)
            log[:] = [e for e in log if e["name"] != name] + [entry]


def main(argv: list[str] | None = None) -> int:
    import make_heldout4 as h4
    return h4.run_parts(__doc__, DEFAULT_OUT, {"torch": torch_part, "optimum": optimum_part, "variants": variants_part},
                        argv, log_name="heldout3_log.json")


if __name__ == "__main__":
    sys.exit(main())
