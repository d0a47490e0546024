"""Embedders: the Protocol and shared parts (base), torch (torch_backend), ONNX Runtime (onnx_backend)."""
