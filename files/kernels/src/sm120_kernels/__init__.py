"""sm_120 Triton kernels for SGLang: W4A16 fused MoE (NVFP4, INT4) and routing."""

try:
    from ._version import __version__
except ImportError:  # source tree that was never built
    __version__ = "0.0.0+unknown"
