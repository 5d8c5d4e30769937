"""`python -m benchmarks.window_fill [MODEL ...]`: the forms of a -inf fill outside a window on float
data (band_w2), timed against the original in onnxruntime (docs/portable.md, "Two-sided bands").

Three forms of the one site, made from the portable output by swapping its last nodes: the kept one
(`Where(Or(Tril(ones), Triu(ones)), -inf, X)`), the 3-node-mask `Where(window, X, -inf)` (X in the
true branch: not exact, a -0.0 of X comes out +0.0) and `Where(Xor(window, true), -inf, X)`. Per
form, at 12 and 1024 tokens, one thread (CPU time) and default threads (wall time): the median of
the per-round ratios portable / original (`portable.time_pair`) and whether every output is
bit-identical to the original's.
"""
from __future__ import annotations

import copy
import os
import sys
import time
from typing import Any

import numpy as np

from benchmarks.portable import identical, session, time_pair

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def forms(path: str) -> dict[str, Any]:
    """The kept portable model and the two alternatives (ModelProtos), by label."""
    import onnx
    from onnx import helper as h
    from onnx import numpy_helper

    import dmlgraph
    kept = dmlgraph.optimize(path, target="onnx").model
    out: dict[str, Any] = {"kept: Where(Or(Tril, Triu), -inf, X) (4/5)": kept}
    swapped = copy.deepcopy(kept)
    g = swapped.graph
    nodes = list(g.node)
    join = next(n for n in nodes if n.op_type == "Or")
    select = next(n for n in nodes if n.op_type == "Where" and join.output[0] in n.input)
    triangles = [n for n in nodes if n.output[0] in join.input]
    # The two triangles, Tril(ones, lo - 1) and Triu(ones, hi) (sorted by `upper`): the window is
    # Tril(Triu(ones, lo), hi - 1).
    tril_k, triu_k = (int(numpy_helper.to_array(next(t for t in g.initializer if t.name == n.input[1])))
                      for n in sorted(triangles, key=lambda n: n.attribute[0].i))
    g.initializer.extend([numpy_helper.from_array(np.array(tril_k + 1, np.int64), "window_lo"),
                          numpy_helper.from_array(np.array(triu_k - 1, np.int64), "window_hi")])
    rewritten: list[onnx.NodeProto] = []
    for n in nodes:
        if n is triangles[0]:
            rewritten += [h.make_node("Trilu", [n.input[0], "window_lo"], ["window_u"], upper=1),
                          h.make_node("Trilu", ["window_u", "window_hi"], ["window"], upper=0)]
        elif n is select:
            rewritten.append(h.make_node("Where", ["window", n.input[2], n.input[1]], list(n.output)))
        elif n not in triangles and n is not join:
            rewritten.append(n)
    del g.node[:]
    g.node.extend(rewritten)
    out["Where(window, X, -inf) (3/4, not exact)"] = swapped
    negated = copy.deepcopy(swapped)
    negated.graph.initializer.append(numpy_helper.from_array(np.array(True), "window_true"))
    rewritten = []
    for n in negated.graph.node:
        if n.op_type == "Where" and "window" in n.input:
            rewritten += [h.make_node("Xor", ["window", "window_true"], ["outside"]),
                          h.make_node("Where", ["outside", n.input[2], n.input[1]], list(n.output))]
        else:
            rewritten.append(n)
    del negated.graph.node[:]
    negated.graph.node.extend(rewritten)
    out["Where(Xor(window, true), -inf, X) (4/5)"] = negated
    for m in out.values():
        onnx.checker.check_model(m)
    return out


def run(names: list[str]) -> None:
    for name in names:
        path = os.path.join(ROOT, "models", f"{name}.onnx")
        variants = forms(path)
        for length in (12, 1024):
            feeds = {"x": np.random.default_rng(length).standard_normal((2, length, 16)).astype(np.float32)}
            for threads, clock in ((1, time.process_time), (0, time.perf_counter)):
                original = session(path, threads)
                want = original.run(None, feeds)
                for label, model in variants.items():
                    other = session(model.SerializeToString(), threads)
                    same = all(identical(a, b) for a, b in zip(want, other.run(None, feeds)))
                    o, p, ratio = time_pair(original, other, feeds, ["y"], 15 if length > 100 else 25, clock)
                    print(f"{name} S={length} threads={threads or 'default'} {label}: ratio {ratio:.3f} "
                          f"(original {o * 1e3:.3f} ms, form {p * 1e3:.3f} ms), bit-identical {same}", flush=True)


if __name__ == "__main__":
    run(sys.argv[1:] or ["band_w2_ts", "band_w2_dynamo"])
