"""Build HELD-OUT round 9: the same families at the opsets exporters still write (14, 15, 16).

    /work/scratch/torchvenv/bin/python models/scripts/make_heldout9.py torch [--out DIR] [WANT ...]
    /work/scratch/optimumvenv/bin/python models/scripts/make_heldout9.py optimum [--out DIR] [WANT ...]
    /work/scratch/torchvenv/bin/python models/scripts/make_heldout9.py variants [--out DIR] [WANT ...]

Rounds 1-8 hold opset 17, 18, 22 and 23 only; older Optimum versions default to opset 14 for
LLaMA-style decoders, onnxruntime-web / transformers.js Hub models are often opset 14, and
TorchScript users pass `opset_version=14`.

`torch` (torch 2.13, transformers 5.x): TorchScript (`dynamo=False`) at opset_version 14, 15 and
16 (names `<base>_ts14` ...) and 17 (the earlier rounds' opset: the baseline of the same
configs), with make_heldout.py's `export` and make_heldout4.py's `export_jobs` (verified
against torch at every input set, rtol/atol 1e-4), of the corpus's and round 1's tiny random
configs: KV decoders llama, mistral (sliding 4), qwen2 (full / sliding 4),
gemma2 (sliding 4 / full), gemma3 (sliding 4 / full), phi3, gpt2, gpt_neox, opt; decoder steps
with a cache of t5, bart, whisper; no cache: llama, mistral sliding 4, qwen3; bert (padding).
`optimum` (optimum-onnx, transformers 4.57): make_heldout2.py's Optimum part (main_export
with past, the decoder pair merged by `merge_decoders`, seq2seq) with opset 14 forced on every
export. `variants`: onnxruntime's transformer optimizer (gpt2, opt_level 1) and quantize_dynamic
(QInt8) of llama_kv_ts14.

Exporter failures are logged in DIR/heldout_log.json; input sets are saved as
DIR/inputs/<model>/<set>.npz, so models/scripts/heldout_report.py DIR measures them. The files
stay out of git (out/ is ignored).
"""

from __future__ import annotations

import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "..", "out", "heldout9")
OPSETS = (14, 15, 16, 17)  # (17: the rounds' own opset, the same configs as the baseline)
KV_BASES = ("gpt2_kv", "llama_kv", "mistral_sw4_kv", "qwen2_mixed_sw4_kv", "gemma2_sw4_kv", "phi3_kv",
            "gpt_neox_kv", "opt_kv", "t5_decoder_kv")
H1_BASES = ("gemma3_sw4_kv", "bart_decoder_kv", "whisper_decoder_kv", "qwen3_nocache")


def torch_part(out: str, want: list[str], log: list[dict]) -> None:
    import make_heldout as h1
    import make_heldout4 as h4
    import make_kv_models as kv
    import transformers as tf
    from make_kv_models import Spec

    by_base = {s.base: s for s in (*kv.specs(), *h1.specs())}
    specs = [by_base[b] for b in (*KV_BASES, *H1_BASES)]
    specs += [Spec("llama_nocache", "transformers LlamaForCausalLM (tiny random config, eager), no cache", kv.llama,
                   "nocache"),
              Spec("mistral_sw4_nocache", "transformers MistralForCausalLM sliding 4 (tiny random, eager), no cache",
                   kv.mistral_sw4, "nocache"),
              Spec("bert", "transformers BertModel encoder (tiny random config, eager), padding mask",
                   lambda: tf.BertModel(tf.BertConfig(vocab_size=kv.VOCAB, hidden_size=32, num_hidden_layers=2,
                                                      num_attention_heads=2, intermediate_size=64,
                                                      max_position_embeddings=128, attn_implementation="eager"),
                                        add_pooling_layer=False), "encoder")]

    def prepare(spec: Spec):  # type: ignore[no-untyped-def]
        module = h1.prepare(spec)
        if spec.kind == "decoder":
            spec.sets["mixed_pad3"] = h4.mixed_pad3(spec.sets["left_padded"])
        if spec.base in ("gpt2_kv", "opt_kv"):  # (position tables of 64: the long set's 72 is past them)
            del spec.sets["long"]
        return module

    for opset in OPSETS:
        kv.TS_OPSET = opset  # (make_heldout.export reads it at each call)
        h4.export_jobs([(s, f"ts{opset}", "torchscript") for s in specs], prepare, out, want, log)


def optimum_part(out: str, want: list[str], log: list[dict]) -> None:
    """make_heldout2's Optimum exports with opset 14 passed to each of Optimum's export calls."""
    import functools

    import make_heldout2 as h2
    import optimum.exporters.onnx as oe

    oe.main_export = functools.partial(oe.main_export, opset=14)
    oe.export_models = functools.partial(oe.export_models, opset=14)
    mine: list[dict] = []
    h2.optimum_part(out, want, mine)
    for e in mine:
        e["source"] = f"{e.get('source', '')} (opset 14)"
    log[:] = [e for e in log if e["name"] not in {m["name"] for m in mine}] + mine


def variants_part(out: str, want: list[str], log: list[dict]) -> None:
    import make_heldout as h1
    pick = lambda names, suffix: tuple(s for s in names if not want or any(w in f"{s}_{suffix}" for w in want))
    h1.VARIANTS = [("int8", "onnxruntime quantize_dynamic QInt8", h1._int8, pick(("llama_kv_ts14",), "int8")),
                   ("ortopt", "onnxruntime.transformers.optimizer (gpt2, opt_level 1)", h1._ortopt(1),
                    pick(("llama_kv_ts14", "gpt2_kv_ts14"), "ortopt"))]
    h1.variants(out, log)


def main(argv: list[str] | None = None) -> int:
    import make_heldout4 as h4
    return h4.run_parts(__doc__, DEFAULT_OUT, {"torch": torch_part, "optimum": optimum_part,
                                               "variants": variants_part}, argv)


if __name__ == "__main__":
    sys.exit(main())
