"""Build HELD-OUT round 2: the deployed kinds round 1 (make_heldout.py) did not cover.

Three parts, each in the venv that has its tools (no weights downloaded: configs built in code):

    /work/scratch/optimumvenv/bin/python models/scripts/make_heldout2.py optimum [--out DIR]
        Optimum's exporter (optimum-onnx 0.1.0, transformers 4.57, torch 2.13.0): `main_export`
        text-generation-with-past of tiny llama / qwen2 / gpt2 (model.onnx), the decoder pair
        (decoder_model + decoder_with_past_model, Optimum's own configs) merged by Optimum's own
        `merge_decoders` (an If on use_cache_branch with the two graphs as branches), and
        text2text-generation-with-past of tiny t5 / bart (Optimum merges their decoders itself).
    /work/scratch/torchvenv/bin/python models/scripts/make_heldout2.py control [--out DIR]
        torch.cond / torch.while_loop through the dynamo exporter (If / Loop with the mask inside).
    <any venv with onnxruntime> models/scripts/make_heldout2.py quant --src DIR [--out DIR]
        int4 MatMulNBits (onnxruntime.quantization.matmul_nbits_quantizer) and onnxruntime's
        transformer optimizer in float16, of round 1's exports in DIR (make_heldout.py's --out).

Every input set is saved as DIR/inputs/<model>/<set>.npz (round 1's layout), so
models/scripts/heldout_report.py DIR measures them. The files stay out of git (out/ is ignored).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import traceback
import warnings

import numpy as np
import onnx

warnings.filterwarnings("ignore")
DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "out", "heldout2")
VOCAB = 100
# (name, batch, past, seq, left zeros in row 0): round 1's KV sets
KV_SETS = (("prefill", 1, 0, 5, 0), ("prefill_past", 1, 5, 3, 0), ("decode", 1, 7, 1, 0),
           ("left_padded", 2, 4, 3, 2), ("long", 1, 8, 64, 0))
NOPAST_SETS = (("seq5", 1, 0, 5, 0), ("left_padded", 2, 0, 7, 3), ("long", 1, 0, 96, 0))
ENC_LEN = 6


# ---- input sets from the model's own input signature ------------------------------------------
def _dim(name: str, batch: int, past: int, seq: int, enc: int) -> int:
    """Optimum's dim names: batch_size, sequence_length, past_sequence_length(+ sequence_length),
    encoder_sequence_length(_out), past_decoder_sequence_length(+ 1)."""
    n = name.lower()
    if "batch" in n:
        return batch
    if "encoder" in n:
        return enc
    if "past" in n and "+" in n:
        return past + (1 if n.endswith("+ 1") else seq)
    if "past" in n:
        return past
    return seq


def kv_feeds(path: str, batch: int, past: int, seq: int, zeros: int, seed: int) -> dict[str, np.ndarray]:
    """Feeds for an Optimum decoder (or decoder step) from its input signature: ids random,
    attention_mask past + seq long with `zeros` left zeros in row 0, position_ids as transformers
    makes them (cumsum - 1, pads at 1), past/encoder states random, use_cache_branch = past > 0."""
    rng = np.random.default_rng(seed)
    model = onnx.load(path, load_external_data=False)
    feeds: dict[str, np.ndarray] = {}
    total = past + seq
    # an encoder's own length is the set's sequence; a decoder step's encoder states are ENC_LEN long
    enc = ENC_LEN if any(i.name == "encoder_hidden_states" for i in model.graph.input) else seq
    for i in model.graph.input:
        tt = i.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        shape = [d.dim_value if d.dim_value else _dim(d.dim_param, batch, past, seq, enc) for d in tt.shape.dim]
        if i.name == "use_cache_branch":
            feeds[i.name] = np.array([past > 0], dtype=bool)
        elif i.name in ("attention_mask", "decoder_attention_mask"):
            m = np.ones((batch, total), dtype)
            m[0, :zeros] = 0
            feeds[i.name] = m
        elif i.name == "encoder_attention_mask":
            m = np.ones(shape, dtype)
            m[0, :2] = 0 if zeros else 1
            feeds[i.name] = m
        elif i.name == "position_ids":
            m = np.ones((batch, total), np.int64)
            m[0, :zeros] = 0
            pos = np.cumsum(m, -1) - 1
            pos[m == 0] = 1
            feeds[i.name] = pos[:, past:].astype(dtype)
        elif dtype.kind in "iu":
            feeds[i.name] = rng.integers(1, VOCAB, shape).astype(dtype)
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def save_sets(path: str, out: str, name: str, sets: tuple) -> list[str]:
    folder = os.path.join(out, "inputs", name)
    os.makedirs(folder, exist_ok=True)
    for k, (set_name, b, p, s, z) in enumerate(sets):
        np.savez_compressed(os.path.join(folder, set_name + ".npz"), **kv_feeds(path, b, p, s, z, k))
    return [s[0] for s in sets]


def _ort_run(path: str, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = {i.name for i in s.get_inputs()}
    return s.run(None, {k: v for k, v in feeds.items() if k in names})


def _agree(a: str, b: str, sets_dir: str, atol: float = 1e-4) -> dict[str, float]:
    """Max abs difference of a's outputs from b's at every saved set (the same output names)."""
    diffs = {}
    for f in sorted(os.listdir(sets_dir)):
        feeds = dict(np.load(os.path.join(sets_dir, f)))
        x, y = _ort_run(a, feeds), _ort_run(b, feeds)
        d = max(float(np.abs(p.astype(np.float64) - q).max()) if p.size else 0.0 for p, q in zip(x, y))
        assert d <= atol, f"{os.path.basename(a)} vs {os.path.basename(b)} at {f}: {d}"
        diffs[f[:-4]] = d
    return diffs


# ---- 1. Optimum's exporter ---------------------------------------------------------------------
def _hf_models() -> dict:
    from transformers import (BartConfig, BartForConditionalGeneration, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                              LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, T5Config,
                              T5ForConditionalGeneration)
    small = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, max_position_embeddings=256, pad_token_id=0, bos_token_id=0, eos_token_id=0)
    return {
        "llama": (lambda: LlamaForCausalLM(LlamaConfig(**small)), "decoder"),
        "qwen2": (lambda: Qwen2ForCausalLM(Qwen2Config(**small)), "decoder"),
        "gpt2": (lambda: GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=256, n_embd=32, n_layer=2, n_head=2,
                                                    bos_token_id=0, eos_token_id=0)), "decoder"),
        "t5": (lambda: T5ForConditionalGeneration(T5Config(vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2,
                                                           num_heads=2, pad_token_id=0, eos_token_id=1,
                                                           decoder_start_token_id=0)), "seq2seq"),
        "bart": (lambda: BartForConditionalGeneration(BartConfig(
            vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=256,
            pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)), "seq2seq"),
    }


def optimum_part(out: str, want: list[str], log: list[dict]) -> None:
    import torch
    from optimum.exporters.onnx import export_models, main_export
    from optimum.exporters.tasks import TasksManager
    from optimum.onnx import merge_decoders

    for family, (build, kind) in _hf_models().items():
        if want and not any(w in family for w in want):
            continue
        torch.manual_seed(0)
        with tempfile.TemporaryDirectory() as tmp:
            src, exp = os.path.join(tmp, "src"), os.path.join(tmp, "exp")
            build().save_pretrained(src)
            task = "text-generation-with-past" if kind == "decoder" else "text2text-generation-with-past"
            entries: list[tuple[str, str, str, tuple]] = []  # (name, file in exp, what, sets)
            try:
                main_export(src, output=exp, task=task, do_validation=True)
                if kind == "decoder":
                    entries.append((f"opt_{family}_model", os.path.join(exp, "model.onnx"),
                                    f"optimum main_export {task} (model.onnx)", KV_SETS))
                    pair = os.path.join(tmp, "pair")
                    from transformers import AutoModelForCausalLM
                    model = AutoModelForCausalLM.from_pretrained(src).eval()
                    ctor = TasksManager.get_exporter_config_constructor(model=model, exporter="onnx", task=task,
                                                                        library_name="transformers")
                    first = ctor(model.config, task="text-generation", use_past=True, use_past_in_inputs=False)
                    later = ctor(model.config, task="text-generation", use_past=True, use_past_in_inputs=True)
                    export_models({"decoder_model": (model, first), "decoder_with_past_model": (model, later)},
                                  output_dir=pair)
                    merge_decoders(os.path.join(pair, "decoder_model.onnx"),
                                   os.path.join(pair, "decoder_with_past_model.onnx"),
                                   save_path=os.path.join(pair, "decoder_model_merged.onnx"))
                    entries += [
                        (f"opt_{family}_decoder", os.path.join(pair, "decoder_model.onnx"),
                         "optimum decoder_model (no past in, present out)", NOPAST_SETS),
                        (f"opt_{family}_merged", os.path.join(pair, "decoder_model_merged.onnx"),
                         "optimum merge_decoders: If on use_cache_branch", KV_SETS)]
                else:
                    for f, what in (("encoder_model.onnx", "encoder"),
                                    ("decoder_model_merged.onnx", "merged decoder: If on use_cache_branch"),
                                    ("decoder_model.onnx", "decoder (no past)"),
                                    ("decoder_with_past_model.onnx", "decoder with past")):
                        if os.path.exists(os.path.join(exp, f)):
                            sets = KV_SETS if "merged" in f or "with_past" in f else NOPAST_SETS
                            if "with_past" in f:
                                sets = tuple(s for s in KV_SETS if s[2] > 0)
                            short = {"encoder_model.onnx": "encoder", "decoder_model_merged.onnx": "merged",
                                     "decoder_model.onnx": "decoder", "decoder_with_past_model.onnx": "with_past"}[f]
                            entries.append((f"opt_{family}_{short}",
                                            os.path.join(exp, f), f"optimum {task} {what}", sets))
            except Exception as e:  # noqa: BLE001 (recorded, not hidden)
                log.append({"name": f"opt_{family}", "ok": False, "error": f"{type(e).__name__}: {str(e)[:400]}"})
                print(f"FAIL opt_{family}: {e}", flush=True)
                traceback.print_exc(limit=4)
                continue
            for name, path, what, sets in entries:
                dst = os.path.join(out, name + ".onnx")
                onnx.save(onnx.load(path), dst)  # external data (if any) folded in: the models are tiny
                entry = {"name": name, "file": name + ".onnx", "source": what, "ok": True,
                         "bytes": os.path.getsize(dst), "input_sets": save_sets(dst, out, name, sets)}
                log[:] = [e for e in log if e["name"] != name] + [entry]
                print(f"OK   {name}: {entry['bytes']} bytes", flush=True)
            if kind == "decoder":  # the merged decoder answers as Optimum's validated model.onnx does
                m, ref = (os.path.join(out, f"opt_{family}_{k}.onnx") for k in ("merged", "model"))
                agree = _agree(m, ref, os.path.join(out, "inputs", f"opt_{family}_merged"))
                next(e for e in log if e["name"] == f"opt_{family}_merged")["verify"] = agree


# ---- 2. torch.cond / torch.while_loop ----------------------------------------------------------
def control_part(out: str, want: list[str], log: list[dict]) -> None:
    import torch
    from torch._higher_order_ops.while_loop import while_loop

    def causal(n: int, shift: torch.Tensor | int = 0) -> torch.Tensor:
        i = torch.arange(n)
        return i[None, :] <= i[:, None] + shift

    def sliding(n: int, w: int = 4) -> torch.Tensor:
        i = torch.arange(n)
        d = i[:, None] - i[None, :]
        return (d >= 0) & (d < w)

    class CondFlag(torch.nn.Module):
        """A flag picks causal or sliding-window 4; the branch applies it (masked_fill)."""

        def forward(self, scores: torch.Tensor, flag: torch.Tensor) -> torch.Tensor:
            return torch.cond(flag.all(),
                              lambda s: s.masked_fill(~causal(s.shape[-1]), float("-inf")).softmax(-1),
                              lambda s: s.masked_fill(~sliding(s.shape[-1]), float("-inf")).softmax(-1),
                              (scores,))

    class CondLength(torch.nn.Module):
        """The sequence length picks: full causal up to 8, sliding window 4 above (Gemma-like)."""

        def forward(self, scores: torch.Tensor) -> torch.Tensor:
            return torch.cond(scores.shape[-1] > 8,
                              lambda s: s.masked_fill(~sliding(s.shape[-1]), float("-inf")).softmax(-1),
                              lambda s: s.masked_fill(~causal(s.shape[-1]), float("-inf")).softmax(-1),
                              (scores,))

    class CondReturnsMask(torch.nn.Module):
        """The branch returns the boolean mask; the caller applies it outside the If."""

        def forward(self, scores: torch.Tensor, flag: torch.Tensor) -> torch.Tensor:
            n = scores.shape[-1]
            dummy = scores[0, 0]
            keep = torch.cond(flag.all(), lambda d: causal(d.shape[-1]) & (d == d),
                              lambda d: sliding(d.shape[-1]) & (d == d), (dummy,))
            return torch.where(keep, scores, torch.finfo(scores.dtype).min).softmax(-1) + n * 0

    class LoopCausal(torch.nn.Module):
        """n steps of y <- softmax(causal(y y^T)) y: the mask built in the Loop body."""

        def forward(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
            def body(i: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                s = (y @ y.transpose(-1, -2)).masked_fill(~causal(y.shape[-2]), float("-inf"))
                return i + 1, s.softmax(-1) @ y
            return while_loop(lambda i, y: i < n, body, (torch.zeros((), dtype=torch.int64), x))[1]

    class LoopBand(torch.nn.Module):
        """n steps of y <- tril/triu band (window 3) of y + y: the band applied to data (y * mask)."""

        def forward(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
            def body(i: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                return i + 1, (y * sliding(y.shape[-1], 3).to(y.dtype)) + y.transpose(-1, -2)
            return while_loop(lambda i, y: i < n, body, (torch.zeros((), dtype=torch.int64), x))[1]

    class LoopOuterMask(torch.nn.Module):
        """The causal mask built outside, read by the Loop body (a captured outer value)."""

        def forward(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
            keep = causal(x.shape[-1])

            def body(i: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                return i + 1, y.masked_fill(~keep, 0.0) @ y
            return while_loop(lambda i, y: i < n, body, (torch.zeros((), dtype=torch.int64), x))[1]

    rng = np.random.default_rng(5)
    S = torch.export.Dim("S", min=2, max=512)
    sq = {"scores": {2: S, 3: S}}
    # (name, module, example input names, dynamic shapes, sets {name: feeds})
    def scores(n: int) -> np.ndarray:
        return rng.standard_normal((1, 2, n, n)).astype(np.float32)

    def square(n: int) -> np.ndarray:
        return (rng.standard_normal((2, n, n)) * 0.3).astype(np.float32)

    flag = {"T": np.array([True]), "F": np.array([False])}
    cases = [
        ("cond_flag", CondFlag(), ["scores", "flag"], {**sq, "flag": None},
         {f"s{n}_{k}": {"scores": scores(n), "flag": v} for n in (4, 9, 33) for k, v in flag.items()}),
        ("cond_length", CondLength(), ["scores"], sq, {f"s{n}": {"scores": scores(n)} for n in (4, 8, 9, 33)}),
        ("cond_returns_mask", CondReturnsMask(), ["scores", "flag"], {**sq, "flag": None},
         {f"s{n}_{k}": {"scores": scores(n), "flag": v} for n in (4, 9, 33) for k, v in flag.items()}),
        ("loop_causal", LoopCausal(), ["x", "n"], {"x": {1: S}, "n": None},
         {f"s{s}_n{n}": {"x": (rng.standard_normal((2, s, 8)) * 0.3).astype(np.float32), "n": np.array(n)}
          for s, n in ((4, 0), (6, 3), (17, 2))}),
        ("loop_band", LoopBand(), ["x", "n"], {"x": {1: S, 2: S}, "n": None},
         {f"s{s}_n{n}": {"x": square(s), "n": np.array(n)} for s, n in ((4, 0), (6, 3), (17, 2))}),
        ("loop_outer_mask", LoopOuterMask(), ["x", "n"], {"x": {1: S, 2: S}, "n": None},
         {f"s{s}_n{n}": {"x": square(s), "n": np.array(n)} for s, n in ((4, 0), (6, 3), (17, 2))}),
    ]
    for name, module, inputs, shapes, sets in cases:
        name = "ctl_" + name
        if want and not any(w in name for w in want):
            continue
        path = os.path.join(out, name + ".onnx")
        try:
            first = next(iter(sets.values()))
            args = tuple(torch.from_numpy(first[k]) for k in inputs)
            prog = torch.onnx.export(module, args, dynamo=True, input_names=inputs, dynamic_shapes=shapes,
                                     opset_version=18, optimize=True)
            prog.save(path)
            onnx.checker.check_model(onnx.load(path), full_check=True)
            folder = os.path.join(out, "inputs", name)
            os.makedirs(folder, exist_ok=True)
            verify = {}
            for set_name, feeds in sets.items():
                want_out = module(*(torch.from_numpy(feeds[k]) for k in inputs)).numpy()
                got = _ort_run(path, feeds)[0]
                d = float(np.abs(np.nan_to_num(got) - np.nan_to_num(want_out)).max())
                assert d <= 1e-4, f"{set_name}: {d}"
                verify[set_name] = d
                np.savez_compressed(os.path.join(folder, set_name + ".npz"), **feeds)
            m = onnx.load(path)
            entry = {"name": name, "file": name + ".onnx", "source": (module.__doc__ or "").strip(), "ok": True,
                     "ops": sorted({n.op_type for n in m.graph.node}), "bytes": os.path.getsize(path),
                     "verify": verify, "input_sets": sorted(sets)}
            print(f"OK   {name}: {entry['ops']}", flush=True)
        except Exception as e:  # noqa: BLE001 (recorded, not hidden)
            entry = {"name": name, "ok": False, "error": f"{type(e).__name__}: {str(e)[:400]}"}
            print(f"FAIL {name}: {entry['error']}", flush=True)
            traceback.print_exc(limit=4)
        log[:] = [e for e in log if e["name"] != name] + [entry]


# ---- 3. int4 MatMulNBits, onnxruntime's optimizer in float16 ----------------------------------
def _int4(a: str, b: str) -> None:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    q = MatMulNBitsQuantizer(onnx.load(a), block_size=32, is_symmetric=True, accuracy_level=4)
    q.process()
    q.model.save_model_to_file(b, use_external_data_format=False)


def _ortopt_fp16(a: str, b: str) -> None:
    from onnxruntime.transformers import optimizer
    opt = optimizer.optimize_model(a, model_type="gpt2", num_heads=2, hidden_size=32, opt_level=1)
    opt.convert_float_to_float16(keep_io_types=True)
    opt.model.ir_version = min(opt.model.ir_version, 10)
    opt.save_model_to_file(b)


QUANT = [("int4", "onnxruntime MatMulNBitsQuantizer int4 (block 32, symmetric)", _int4),
         ("ortopt_fp16", "onnxruntime.transformers optimizer (gpt2, opt_level 1) + float16 (keep_io_types)",
          _ortopt_fp16)]
QUANT_SOURCES = ("qwen3_kv_ts", "qwen3_kv_dynamo", "gemma3_sw4_kv_dynamo", "gpt_bigcode_kv_dynamo")


def quant_part(out: str, src: str, want: list[str], log: list[dict]) -> None:
    sources = [(src, s) for s in QUANT_SOURCES] + [(out, s) for s in ("opt_llama_model", "opt_llama_merged")]
    for suffix, how, convert in QUANT:
        for folder, source in sources:
            name = f"{source}_{suffix}"
            if want and not any(w in name for w in want) or not os.path.exists(os.path.join(folder, source + ".onnx")):
                continue
            entry = {"name": name, "file": name + ".onnx", "source": f"{how} of {source}", "variant_of": source}
            try:
                convert(os.path.join(folder, source + ".onnx"), os.path.join(out, name + ".onnx"))
                shutil.copytree(os.path.join(folder, "inputs", source), os.path.join(out, "inputs", name),
                                dirs_exist_ok=True)
                entry.update(ok=True, bytes=os.path.getsize(os.path.join(out, name + ".onnx")),
                             ops=sorted({n.op_type for n in onnx.load(os.path.join(out, name + ".onnx")).graph.node}))
                print(f"OK   {name}", flush=True)
            except Exception as e:  # noqa: BLE001 (recorded, not hidden)
                entry.update(ok=False, error=f"{type(e).__name__}: {str(e).strip()[:400]}")
                print(f"FAIL {name}: {entry['error']}", flush=True)
            log[:] = [e for e in log if e["name"] != name] + [entry]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=["optimum", "control", "quant"])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--src", default=os.path.join(os.path.dirname(DEFAULT_OUT), "heldout"),
                    help="round 1's folder (quant's sources)")
    ap.add_argument("want", nargs="*")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    log_path = os.path.join(args.out, "heldout2_log.json")
    log = json.load(open(log_path)) if os.path.exists(log_path) else []
    if args.part == "optimum":
        optimum_part(args.out, args.want, log)
    elif args.part == "control":
        control_part(args.out, args.want, log)
    else:
        quant_part(args.out, args.src, args.want, log)
    with open(log_path, "w") as f:
        json.dump(sorted(log, key=lambda e: e["name"]), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
