from dmlgraph.tools.cli import entry

entry()
