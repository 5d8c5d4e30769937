"""Small synthetic models: the demo model (see dmlgraph.io.resources)."""
