"""sha256 of every corpus model's optimized output on both targets: the guard of a change that
must not move what dmlgraph writes (or must say which outputs it moved).

    .venv/bin/python tests/hash_corpus.py ROOT OUT.json    # ROOT: a checkout (its models/)

Run it on a checkout of main (PYTHONPATH=that checkout) and on the change, then compare the two
JSON files: each key is `models/<file>:<target>`, each value a sha256 or the error it raised.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import sys
import tempfile

import dmlgraph


def main(root: str, out_path: str) -> None:
    files = sorted(glob.glob(os.path.join(root, "models", "*.onnx"))
                   + glob.glob(os.path.join(root, "models", "synthetic", "*.onnx")))
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as d:
        for f in files:
            for target in ("dml", "onnx"):
                key = f"{os.path.relpath(f, root)}:{target}"
                try:
                    path = os.path.join(d, "o.onnx")
                    dmlgraph.optimize(f, target=target).save(path)
                    with open(path, "rb") as written:
                        out[key] = hashlib.sha256(written.read()).hexdigest()
                except Exception as e:  # noqa: BLE001 - a failure is recorded, not fatal: it is compared too
                    out[key] = f"ERR {type(e).__name__}: {e}"[:200]
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
    print(len(out), "outputs hashed")


if __name__ == "__main__":
    main(*sys.argv[1:3])
