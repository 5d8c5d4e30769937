from dmlgraph.cli import entry

entry()
