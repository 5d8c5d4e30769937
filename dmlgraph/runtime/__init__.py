"""Running graphs: the DIAGONAL_MATRIX1 kernels, binding templates to shapes, onnxruntime, and the executor."""
