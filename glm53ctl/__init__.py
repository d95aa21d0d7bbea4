"""glm53ctl: build, prove, fault-inject, tune and benchmark GLM-5.3-Flash decode kernels."""

__version__ = "0.1.0"
