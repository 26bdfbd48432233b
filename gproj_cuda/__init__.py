"""gproj_cuda: FlashAttention-class attention for Hopper with correct BF16 gradients.

    import gproj_cuda
    out = gproj_cuda.attention(q, k, v, causal=True)          # (B, N, H, d), bf16/fp16

See README.md. ``reference`` holds the float64 reference and the CPU emulation of the kernels'
arithmetic; ``python -m gproj_cuda`` runs the numerics study.
"""

from . import reference
from ._ext import compiled_configs, is_available, unavailable_reason
from .api import attention, attention_varlen, flash_attn_func, flash_attn_varlen_func

__version__ = "0.1.0"

__all__ = [
    "attention", "attention_varlen", "flash_attn_func", "flash_attn_varlen_func",
    "is_available", "unavailable_reason", "compiled_configs", "reference", "__version__",
]
