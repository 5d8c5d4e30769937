"""The IR: DML data types, buffer tensor descs, operator descs, band analysis and the graph of Values and Nodes.

Everything else in dmlgraph is built on these; they import nothing above them.
"""
