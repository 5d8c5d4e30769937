"""`python -m benchmarks [all|kernels|pipeline|portable|sizes] [--quick] [--json FILE]` (what `make bench` runs)."""
from __future__ import annotations

import argparse
import sys

from dmlgraph.errors import DmlgraphError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Measure each goal as a ratio against a baseline run side by side (medians). 'all' (default) "
                    "runs both suites, then prints one table of the goals; 'kernels' is the DIAGONAL_MATRIX1 kernel "
                    "(about a minute), 'pipeline' the optimizer, end to end, executor and memory (several minutes; "
                    "writes 2 GiB to a temporary folder unless --quick), 'portable' the --target onnx output against "
                    "the original in onnxruntime at every saved input set and a 1024-token prefill (time, outputs, "
                    "memory; about half an hour on 2 cores), 'sizes' the nodes and bytes of both targets' outputs "
                    "per model (a Markdown table).")
    ap.add_argument("suite", choices=["all", "kernels", "pipeline", "portable", "sizes"], nargs="?", default="all")
    ap.add_argument("--quick", action="store_true", help="a reduced set (smoke run)")
    ap.add_argument("--json", dest="json_out", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    try:
        if args.json_out is not None:  # an unwritable path fails now, not after the whole run
            from dmlgraph.pipeline import check_output_path
            check_output_path(args.json_out, what="the JSON rows")
        if args.suite == "kernels":
            from benchmarks import kernels
            kernels.run(quick=args.quick, json_out=args.json_out)
        elif args.suite == "pipeline":
            from benchmarks import pipeline
            pipeline.run(quick=args.quick, json_out=args.json_out)
        elif args.suite == "portable":
            from benchmarks import portable
            portable.run(quick=args.quick, json_out=args.json_out)
        elif args.suite == "sizes":
            from benchmarks import size_table
            size_table.run(json_out=args.json_out)
        else:
            from benchmarks import goals
            goals.run(quick=args.quick, json_out=args.json_out)
    except DmlgraphError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
