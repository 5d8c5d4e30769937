"""dmlgraph: lower diagonal-structured ONNX computations onto DirectML's DIAGONAL_MATRIX1."""
__version__ = "0.1.0"
