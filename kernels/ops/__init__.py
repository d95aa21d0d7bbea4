"""The ops: one folder per piece of the model's math, each with its PyTorch reference (`naive.py`), its Triton
device bodies (`kernel.py`, the bodies every launch kind calls) and a plain launch of those bodies for its test."""
