"""The `dmlgraph` command line: optimize, run, validate, inspect, dxdispatch, demo.

Exit codes: 0 success; 1 the check failed (validate found a mismatch); 2 bad input or usage
(a message says what is wrong and what to do); 3 an internal error (a bug: rerun with --debug).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

from dmlgraph import __version__
from dmlgraph.errors import DmlgraphError
from dmlgraph.process import interrupts_deferred, process_wide

if TYPE_CHECKING:
    from dmlgraph.rewrite import Options

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a tool whose reader went away


def _progress(enabled: bool) -> Callable[[str], None] | None:
    """A progress printer for terminals; silent when piped (or with --json)."""
    if not enabled or not sys.stderr.isatty():
        return None
    return lambda msg: print(f"  .. {msg}", file=sys.stderr, flush=True)


def _options(args: argparse.Namespace) -> Options:
    from dmlgraph.pipeline import make_options
    return make_options(exact=args.exact, feature_level=args.feature_level)


def _emit(args: argparse.Namespace, payload: dict, text: str) -> None:
    print(json.dumps(payload, indent=2, sort_keys=True, default=str) if args.json else text)


# ---- commands --------------------------------------------------------------------------------
def cmd_optimize(args: argparse.Namespace) -> int:
    if os.path.isdir(args.model):
        return _optimize_folder(args)
    # One model: what the command makes (the modules it imports, the graph) lives until the exit,
    # and the collector's passes over it would free nothing (a tenth of a small model's run).
    with _collector_paused():
        return _optimize_file(args)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic collector off during the block, as it was after (not `graph.gc_paused`: that
    module imports numpy and onnx, which `_load_onnx` must import first)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _optimize_file(args: argparse.Namespace) -> int:
    from dmlgraph import api
    from dmlgraph.tools.report import optimize_text
    show = _progress(not args.json)
    result = api.optimize(args.model, target=args.target, exact=args.exact, feature_level=args.feature_level,
                          progress=show, allow_growth=args.allow_growth)
    before_bytes = os.path.getsize(args.model)  # before an --in-place write replaces it
    if show:  # (the write is most of a big model's run: 7 of 10 s with 2 GiB of weights)
        from dmlgraph.inspection import format_bytes
        show(f"writing {args.output} ({format_bytes(result.after['initializer_bytes'])} of weights)")
    data_path = args.output + ".data"  # where a model over 2 GiB keeps its weights
    data_before = _file_id(data_path)
    size = result.save(args.output, in_place=args.in_place)
    data_after = _file_id(data_path)  # (a save that wrote it renamed a new file into place)
    result.report["output"] = args.output
    result.report["external_data"] = data_path if data_after is not None and data_after != data_before else None
    if result.report["external_data"]:
        result.report["after"]["data_file_bytes"] = os.path.getsize(data_path)
    result.report["before"]["file_bytes"] = before_bytes
    result.report["after"]["file_bytes"] = size
    _emit(args, result.report, optimize_text(result.report, args.verbose))
    return EXIT_OK


def _file_id(path: str) -> tuple[int, int, int] | None:
    """What tells a replaced file from the one that was there: device, inode, mtime (None: none)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns


def _optimize_folder(args: argparse.Namespace) -> int:
    """Every .onnx under the folder, by a process pool; exit 2 when any model failed."""
    from dmlgraph.tools import batch
    if args.in_place:
        raise DmlgraphError("--in-place does not apply to a folder", hint="pass another folder for -o")
    options = batch.BatchOptions(args.target, args.exact, args.feature_level, args.allow_growth)
    show = batch.progress_line() if sys.stderr.isatty() and not args.json else None
    outcomes = batch.run_batch(args.model, args.output, options, args.jobs, show)
    payload = {"models": [o.to_json() for o in outcomes], "failed": sum(not o.ok for o in outcomes)}
    _emit(args, payload, batch.summary_text(outcomes))
    return EXIT_USAGE if payload["failed"] else EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    from dmlgraph import pipeline
    if args.output is not None:
        pipeline.check_output_path(args.output, args.model)  # fail before a long run, not after
    _, g = pipeline.load(args.model)
    dims = pipeline.parse_dims(args.dim)
    feeds = pipeline.load_inputs(args.inputs) if args.inputs else pipeline.make_inputs(g, dims, args.seed)
    with contextlib.nullcontext() if args.inputs else pipeline.generated_inputs_hint(g, dims):
        outputs = pipeline.run_graph(g, feeds, args.threads)  # checks names, dtypes and shapes of the feeds
    if args.output is not None:
        pipeline.save_outputs(outputs, args.output, args.model)  # atomic; exactly this name (no .npz added)
    payload = {"model": args.model, "outputs": {k: {"shape": list(v.shape), "dtype": str(v.dtype)}
                                                for k, v in outputs.items()}, "written": args.output}
    text = "\n".join(f"{k}: {v.dtype} {list(v.shape)}" for k, v in outputs.items())
    _emit(args, payload, text + (f"\nwrote {args.output}" if args.output else ""))
    return EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    from dmlgraph import pipeline
    from dmlgraph.tools.report import validate_text
    if args.lowered is not None and (args.exact or args.feature_level != "5_1"):
        raise DmlgraphError("--exact and --feature-level choose how validate lowers MODEL; LOWERED is compared "
                            "as it was written", hint="pass them to `dmlgraph optimize` instead, or drop LOWERED")
    feeds = pipeline.load_inputs(args.inputs) if args.inputs else None
    report = pipeline.validate(args.model, args.lowered, feeds, dims=pipeline.parse_dims(args.dim), seed=args.seed,
                               options=_options(args), threads=args.threads).report
    _emit(args, report, validate_text(report))
    return EXIT_OK if report["ok"] else EXIT_MISMATCH


def cmd_inspect(args: argparse.Namespace) -> int:
    from dmlgraph import pipeline
    from dmlgraph.tools.inspection_render import inspect_command
    for flag, out in (("--dot", args.dot), ("--svg", args.svg)):
        if out:  # `--dot model.onnx` must not replace the model
            pipeline.check_output_path(out, args.model, f"the {flag} output")
    return inspect_command(args)


def cmd_dxdispatch(args: argparse.Namespace) -> int:
    from dmlgraph import pipeline
    from dmlgraph.tools import dxdispatch
    if (args.model is None) == (args.check is None):
        raise DmlgraphError("give either MODEL (to export) or --check DIR (to compare DxDispatch's output)",
                            hint="dmlgraph dxdispatch MODEL --inputs IN.npz -o DIR, or dmlgraph dxdispatch --check DIR")
    if args.check is not None:
        report = dxdispatch.check(args.check)
        _emit(args, report, dxdispatch.check_text(report))
        return EXIT_OK if report["ok"] else EXIT_MISMATCH
    if args.output is None:
        raise DmlgraphError("-o DIR is required to export", hint="dmlgraph dxdispatch MODEL -o DIR")
    feeds = pipeline.load_inputs(args.inputs) if args.inputs else None
    report = dxdispatch.export(args.model, args.output, feeds, pipeline.parse_dims(args.dim), args.seed,
                               _options(args), args.force)
    _emit(args, report, dxdispatch.export_text(report))
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    """Optimize the bundled causal-attention model, then validate it against onnxruntime."""
    import tempfile

    from dmlgraph import api, pipeline
    from dmlgraph.io.resources import DEMO_MODEL, bundled_model
    from dmlgraph.tools.report import optimize_text, validate_text
    model = args.model or bundled_model(DEMO_MODEL)
    if args.output is None:  # a throwaway output, removed afterwards
        with tempfile.TemporaryDirectory(prefix="dmlgraph-demo-") as folder:
            args.output = os.path.join(folder, "lowered.onnx")
            return cmd_demo(args)
    out = args.output
    print(f"$ dmlgraph optimize {os.path.relpath(model)} -o {out}")
    result = api.optimize(model, exact=args.exact, feature_level=args.feature_level)
    size = result.save(out)
    result.report["before"]["file_bytes"] = os.path.getsize(model)
    result.report["after"]["file_bytes"] = size
    print(optimize_text(result.report))
    ok = True
    for seq in (5, 16):
        print(f"\n$ dmlgraph validate {os.path.relpath(model)} --dim seq={seq} --dim batch=2")
        report = pipeline.validate(model, dims={"seq": seq, "batch": 2}, options=_options(args)).report
        print(validate_text(report))
        ok &= report["ok"]
    return EXIT_OK if ok else EXIT_MISMATCH


# ---- parser ----------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """argparse with dmlgraph's error format: one `dmlgraph: error:` line and a hint, exit 2."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.split(" ", 1)[1] + ": " if " " in self.prog else ""
        self.exit(EXIT_USAGE, f"dmlgraph: error: {command}{message}\n  hint: see '{self.prog} --help'\n")


def _int_at_least(lo: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"{value} is less than {lo}")
        return value
    parse.__name__ = f"integer >= {lo}"
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="dmlgraph", description="Lower diagonal-structured ONNX computations "
                                "(EyeLike, Trilu, causal/band masks) onto DirectML DIAGONAL_MATRIX1.",
                                epilog="exit codes: 0 ok; 1 validate or dxdispatch --check found a mismatch (inspect "
                                "--fail-on-missed: a missed mask); 2 bad input or usage; 3 internal error (a bug); "
                                "130 interrupted; 141 the reader of the output went away")
    p.add_argument("--version", action="version", version=f"dmlgraph {__version__}")
    p.add_argument("--debug", action="store_true", help="show Python tracebacks on errors")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for add in (_add_optimize, _add_run, _add_validate, _add_inspect, _add_dxdispatch, _add_demo):
        add(sub)
    for sp in sub.choices.values():  # after the command too, where the internal-error hint's rerun puts it
        sp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show Python tracebacks on errors (also accepted before COMMAND)")
    return p


def _lowering_flags(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--feature-level", default="5_1", metavar="L",
                    help="target DML feature level, e.g. 4_0 or 5_1 (default 5_1)")
    sp.add_argument("--exact", action="store_true", help="only bit-exact rewrites")


def _input_flags(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--inputs", metavar="IN.npz", help="inputs keyed by graph input name (numpy.savez; "
                    "default: random inputs of the declared types)")
    sp.add_argument("--dim", action="append", metavar="NAME=SIZE",
                    help="size of a symbolic dim for generated inputs (repeatable; default 4 each, a dim named "
                    "'a + b' their sum)")
    sp.add_argument("--seed", type=_int_at_least(0), default=0, help="seed for generated inputs (default 0)")


def _threads_flag(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--threads", type=_int_at_least(1), default=None, metavar="N",
                    help="onnxruntime intra-op threads (default: onnxruntime's, one per core)")


def _json_flag(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--json", action="store_true", help="machine-readable report on stdout")


def _add_optimize(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("optimize", help="lower a model and write it", description="Lower every diagonal-"
                        "structured computation and write the model (atomically).")
    sp.add_argument("model", help="an .onnx file, or a folder: every .onnx under it")
    sp.add_argument("-o", "--output", required=True, help="output .onnx path (a folder when MODEL is one)")
    sp.add_argument("--allow-growth", action="store_true",
                    help="write the lowering even where it makes the model bigger (default: each site whose "
                    "lowering would grow the model is declined, with the nodes or bytes it would add)")
    sp.add_argument("--target", choices=["dml", "onnx"], default="dml",
                    help="dml: com.dmlgraph DiagonalMatrix1 nodes; onnx: standard ops only (default dml)")
    _lowering_flags(sp)
    sp.add_argument("--in-place", action="store_true", help="allow -o to be the input model")
    sp.add_argument("-j", "--jobs", type=_int_at_least(1), default=os.cpu_count() or 1,
                    help="worker processes for a folder (default: one per CPU)")
    sp.add_argument("-v", "--verbose", action="store_true", help="list every rewrite and every decline")
    _json_flag(sp)
    sp.set_defaults(func=cmd_optimize)


def _add_run(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("run", help="run a model (original or lowered) with the executor",
                        description="Run MODEL (DML nodes on dmlgraph's reference kernels, the rest in "
                        "onnxruntime) and print each output's dtype and shape; -o keeps the values.")
    sp.add_argument("model", help="an .onnx file")
    _input_flags(sp)
    sp.add_argument("-o", "--output", metavar="OUT.npz", help="write the outputs keyed by graph output name "
                    "(numpy.savez, atomically, exactly this path)")
    _threads_flag(sp)
    _json_flag(sp)
    sp.set_defaults(func=cmd_run)


def _add_validate(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("validate", help="lower in memory and compare against onnxruntime",
                        description="Run MODEL and its lowered form on the same inputs (--inputs, else random "
                        "ones) and compare every tensor a rewrite produced and every output. The lowered form "
                        "is MODEL lowered in memory (target dml), or LOWERED: a model `optimize` wrote.")
    sp.add_argument("model", help="an .onnx file")
    sp.add_argument("lowered", nargs="?", metavar="LOWERED",
                    help="the model `optimize` wrote from MODEL (either target), to check that file instead "
                    "(not with --exact or --feature-level, which choose the in-memory lowering)")
    _input_flags(sp)
    _lowering_flags(sp)
    _threads_flag(sp)
    _json_flag(sp)
    sp.set_defaults(func=cmd_validate)


def _add_inspect(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("inspect", help="what is in a model, what lowers, what it saves, and why not",
                        description="Read MODEL (nothing is written): its header, every candidate with the "
                        "DML operator desc it lowers to, every decline with its reason, the mask census and "
                        "the before/after totals of the chosen target (docs/inspect.md).")
    sp.add_argument("model", help="an .onnx file")
    sp.add_argument("--feature-level", default="5_1", metavar="L",
                    help="target DML feature level, e.g. 4_0 or 5_1 (default 5_1)")
    sp.add_argument("--exact", action="store_true", help=argparse.SUPPRESS)
    sp.add_argument("--target", choices=["dml", "onnx"], default="dml",
                    help="the target whose written model the totals describe (default dml)")
    sp.add_argument("--top", type=int, default=10, metavar="N", help="largest N initializers (default 10)")
    sp.add_argument("--dot", metavar="FILE", help="write the graph as Graphviz DOT")
    sp.add_argument("--svg", metavar="FILE", help="render the DOT graph to SVG (needs `dot`)")
    sp.add_argument("--fail-on-missed", action="store_true",
                    help="exit 1 when a mask-like tensor is neither lowered nor declined (a CI gate)")
    sp.add_argument("-v", "--verbose", action="store_true",
                    help="list every node of each candidate and decline (else a long list is summed up by op)")
    _json_flag(sp)
    sp.set_defaults(func=cmd_inspect)


def _add_dxdispatch(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("dxdispatch", help="export DML operators to a DxDispatch model, or check its output",
                        description="Export: lower MODEL (unless it is lowered already), run it, and write "
                        "DIR/model.json with one dispatch per DML node, its real inputs as .npy and the "
                        "expected outputs. Check: compare what DxDispatch wrote with DIR/expected, bit for bit.")
    sp.add_argument("model", nargs="?", help="an .onnx file (not with --check)")
    sp.add_argument("-o", "--output", metavar="DIR", help="folder to write (must be new or empty)")
    sp.add_argument("--check", metavar="DIR", help="compare DxDispatch's output in DIR with DIR/expected")
    sp.add_argument("--force", action="store_true", help="replace DIR if it holds a previous export")
    _input_flags(sp)
    _lowering_flags(sp)
    _json_flag(sp)
    sp.set_defaults(func=cmd_dxdispatch)


def _add_demo(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("demo", help="optimize and validate the bundled causal-attention model",
                        description="Optimize the bundled causal-attention model (target dml), then validate "
                        "it against onnxruntime at two sequence lengths.")
    sp.add_argument("model", nargs="?", help=argparse.SUPPRESS)
    sp.add_argument("-o", "--output", help="keep the lowered model here (default: a temporary file, removed)")
    _lowering_flags(sp)
    sp.set_defaults(func=cmd_demo)


def _printable(text: str) -> str:
    """One line: names from a model file may hold newlines or control characters; escape them."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


EXIT_INTERRUPTED = 130  # 128 + SIGINT


class _Interrupts:
    """SIGINT while a command runs: the first one raises KeyboardInterrupt, later ones only count.

    Whatever the interrupt turns into on its way out (an ImportError when it lands inside numpy's
    import, an OSError from a child being stopped, nothing at all when C code swallows it), the
    command then ends as interrupted: exit 130 and one line. Output files are atomic, so an
    interrupted command leaves either nothing or a complete file.
    """

    def __init__(self) -> None:
        self.count = 0
        self._old: Callable[[int, FrameType | None], Any] | int | None = None

    def __enter__(self) -> "_Interrupts":
        try:
            self._old = signal.signal(signal.SIGINT, self._handle)
        except ValueError:  # not the main thread (an embedding): Python's default handling stays
            self._old = None
        return self

    def __exit__(self, *exc: object) -> None:
        # After an interrupt the process is on its way out with 130: this handler (which now only
        # counts) stays, so a late or repeated Ctrl-C cannot turn that into a KeyboardInterrupt
        # escaping at exit. Otherwise the caller's handler comes back.
        if self._old is not None and not self.count:
            signal.signal(signal.SIGINT, self._old)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.count == 1:
            raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    with _Interrupts() as interrupts:
        code = _main(argv, interrupts)
        if interrupts.count:  # (also when the interrupt was swallowed on its way out)
            print("dmlgraph: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        return code


def entry() -> None:
    """The program (`dmlgraph`, `python -m dmlgraph`): `main`, then exit with its code. After an
    interrupt it leaves at once (its files are already committed or removed): a Ctrl-C that lands
    in the interpreter's own shutdown would otherwise end it by SIGINT instead of exit 130."""
    code = main()
    if code == EXIT_INTERRUPTED:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
    # The work is done and its files committed: a Ctrl-C landing in the interpreter's shutdown has
    # nothing left to interrupt, and must not turn a finished run into death by SIGINT.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The shutdown's last collection would walk every object still alive (modules, the graph) to
    # free what the exit frees anyway; frozen, they are left to the exit (a twentieth of a run).
    gc.freeze()
    sys.exit(code)


def _one_blas_thread() -> None:
    """Optimizing does no linear algebra: one OpenBLAS thread instead of one per CPU, which numpy's
    import starts and which spin a while on the CPUs the command's work shares (2-5% of a small
    model's run). OpenBLAS reads the variable when numpy is first imported, so this is set before
    that (and never over the user's own setting)."""
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _load_onnx() -> None:
    """onnx (and numpy), which every command uses, with Ctrl-C held back: an interrupt landing in
    its C++ extension's import aborts the process (std::terminate). The collector is paused: an
    import makes only objects that live as long as the process, its passes would free nothing."""
    with _collector_paused(), interrupts_deferred():
        import onnx  # noqa: F401


def _json_error(args: argparse.Namespace, message: str, hint: str | None, code: int) -> None:
    """With --json, a failure's document on stdout (the error line stays on stderr): a script
    reading stdout gets `{"error": {"message", "hint", "exit_code"}}` instead of nothing."""
    if getattr(args, "json", False):
        with contextlib.suppress(OSError, ValueError):  # (a closed stdout: the stderr line was enough)
            print(json.dumps({"error": {"message": message, "hint": hint, "exit_code": code}}, indent=2, sort_keys=True))


def _main(argv: Sequence[str] | None, interrupts: _Interrupts) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, or a usage error (already printed)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        with process_wide():  # this process is ours: gc pauses, memory caps, an inference child
            if args.func is cmd_optimize:
                _one_blas_thread()
            _load_onnx()
            return args.func(args)
    except KeyboardInterrupt:
        if not interrupts.count:  # raised by something other than our handler: still an interrupt
            interrupts.count = 1
        return EXIT_INTERRUPTED
    except DmlgraphError as e:
        if interrupts.count:
            return EXIT_INTERRUPTED
        if args.debug:
            traceback.print_exc()
        print(f"dmlgraph: error: {_printable(Exception.__str__(e))}", file=sys.stderr)
        if e.hint:
            print(f"  hint: {_printable(e.hint)}", file=sys.stderr)
        _json_error(args, Exception.__str__(e), e.hint, e.exit_code)
        return e.exit_code
    except BrokenPipeError:
        # The reader went away (`... --json | head`): stop quietly, as Unix tools do. Output files
        # are already complete or cleaned up; the interpreter's last flush now goes nowhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_CLOSED_PIPE
    except Exception as e:  # noqa: BLE001 - the last line of defence: no bare tracebacks for users
        if interrupts.count:
            return EXIT_INTERRUPTED
        if args.debug:  # the traceback, and still the exit code that says "a bug"
            traceback.print_exc()
        hint = "this is a bug in dmlgraph; rerun with --debug and report the traceback"
        print(f"dmlgraph: internal error: {type(e).__name__}: {_printable(str(e))}\n  hint: {hint}", file=sys.stderr)
        _json_error(args, f"internal error: {type(e).__name__}: {e}", hint, EXIT_INTERNAL)
        return EXIT_INTERNAL


if __name__ == "__main__":
    entry()
