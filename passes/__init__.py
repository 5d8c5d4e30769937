"""The rewrite rules of dmlgraph, grouped into ordered rule sets."""
