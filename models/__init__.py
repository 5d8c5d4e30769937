"""The bundled ONNX models (installed as package data; see dmlgraph.io.resources)."""
