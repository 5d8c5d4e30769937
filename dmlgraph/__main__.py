"""`python -m dmlgraph`: the `dmlgraph` command, for environments where the script is not on PATH.

One call into the CLI's entry, so `-m` and the console script cannot drift apart.
"""
from dmlgraph.tools.cli import entry

entry()
