"""Which keys a query may see: one definition shared by the reference, the emulator and the checks.

Conventions follow FlashAttention-3: masks are aligned to the *bottom right* of the score matrix,
so query row ``i`` of a sequence with ``nq`` queries and ``nk`` keys sits at key position
``i + nk - nq``. ``window_size = (left, right)`` keeps keys in
``[i + nk - nq - left, i + nk - nq + right]``; ``-1`` means unbounded on that side. ``causal`` is
the window ``(left, 0)``. ``shift`` moves the diagonal further (context parallelism: a query chunk
at global position ``oq`` against a key chunk at ``ok`` has ``shift = oq - ok - (nk - nq)``).
"""

from __future__ import annotations

import torch


def normalize_window(causal: bool, window_size) -> tuple[int, int]:
    """Return the effective ``(left, right)`` window; ``causal`` forces ``right = 0``."""
    left, right = (int(window_size[0]), int(window_size[1]))
    if causal:
        right = 0
    return left, right


def visible(nq: int, nk: int, left: int, right: int, device=None, shift: int = 0) -> torch.Tensor:
    """Boolean ``(nq, nk)`` tensor: True where query ``i`` may attend to key ``j``."""
    i = torch.arange(nq, device=device).unsqueeze(1)
    j = torch.arange(nk, device=device).unsqueeze(0)
    diag = i + (nk - nq) + shift
    keep = torch.ones(nq, nk, dtype=torch.bool, device=device)
    if right >= 0:
        keep &= j <= diag + right
    if left >= 0:
        keep &= j >= diag - left
    return keep
