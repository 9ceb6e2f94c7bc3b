"""Tools that act on a model without training it: Hugging Face swaps, ONNX export, numerics, FFN bench."""
