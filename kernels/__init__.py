"""The Triton side: model spec, PyTorch references beside Triton bodies, the launch runtime."""
