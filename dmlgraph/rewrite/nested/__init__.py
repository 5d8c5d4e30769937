"""Masks inside If/Loop/Scan bodies and model-local functions, lowered in place (`optimize_nested`).

One module per concept, bottom to top: `scopes` (holders, names, report paths), `body_types` (formal
input types), `enclosing` (borrowed constants, copied cones), `bodies` (a body as a typed Graph),
`write_back`, `functions` (local functions and their call sites), `driver` (the walk). This module
names what the rest of the package uses.
"""
from dmlgraph.rewrite.nested.bodies import execution_body, import_together
from dmlgraph.rewrite.nested.body_types import FRESH_PREFIX
from dmlgraph.rewrite.nested.driver import Census, optimize_nested
from dmlgraph.rewrite.nested.functions import PRELUDE_PREFIX, execution_function
from dmlgraph.rewrite.nested.scopes import (
    LOWERED,
    SCOPE,
    Scope,
    all_nodes,
    body_path,
    in_lowered_graph,
    nested_dml_nodes,
    qualified_name,
    scopes,
)

__all__ = ["Census", "FRESH_PREFIX", "LOWERED", "PRELUDE_PREFIX", "SCOPE", "Scope", "all_nodes", "body_path",
           "execution_body", "execution_function", "import_together", "in_lowered_graph", "nested_dml_nodes",
           "optimize_nested", "qualified_name", "scopes"]
