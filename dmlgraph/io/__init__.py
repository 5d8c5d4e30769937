"""Model files and protos: reading (untrusted), writing (atomic), onnx's shape inference, and ONNX <-> IR."""
