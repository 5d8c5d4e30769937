"""Rules propose, one rewriter applies: the engine, and the scopes (If/Loop/Scan bodies, functions) it runs in."""
from dmlgraph.rewrite.engine import (
    Context,
    Match,
    Options,
    PassManager,
    PassResult,
    Replacement,
    Rewriter,
    RewriteRefused,
    Rule,
    detached,
    detached_constant,
    site_key,
)

__all__ = ["Context", "Match", "Options", "PassManager", "PassResult", "Replacement", "RewriteRefused", "Rewriter",
           "Rule", "detached", "detached_constant",
           "site_key"]
