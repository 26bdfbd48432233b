"""Small shapes through every kernel, for compute-sanitizer (memcheck / racecheck): both numerics
modes, every dtype and head dim, masks, varlen, the sm90 forward variants (GPROJ_FWD_VARIANT) and
the partial passes of context parallelism (gproj_cuda.chunks, with a moved causal diagonal)."""
import itertools
import os

import torch

import gproj_cuda
from gproj_cuda import chunks
from gproj_cuda.centering import center_keys, query_shift

torch.manual_seed(0)
ONLY_HOPPER_BWD = os.environ.get("SANITIZE_ONLY_HOPPER_BWD") == "1"   # the newest kernels alone
ONLY_FWD = os.environ.get("SANITIZE_ONLY_FWD") == "1"   # the forward variants (+ their backward)
# Varlen slot grids (session 14) alone: every head dim and mode, 40 sequences (two rounds of the
# warp's search), empty ones and whole tiles among them, forward and backward
if os.environ.get("SANITIZE_ONLY_VARLEN") == "1":
    lens = [0, 1, 127, 128, 129, 0, 300] + [int(x) for x in torch.randint(0, 90, (33,))]
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device="cuda")
    for d in (64, 128, 256):
        for numerics in ("gproj", "fa3"):
            for causal in (False, True):
                q = torch.randn(sum(lens), 4, d, device="cuda", dtype=torch.bfloat16,
                                requires_grad=True)
                k = torch.randn(sum(lens), 2, d, device="cuda", dtype=torch.bfloat16,
                                requires_grad=True)
                o = gproj_cuda.attention_varlen(q, k, k, cu, cu, max(lens), max(lens),
                                                causal=causal, numerics=numerics)
                o.backward(torch.randn_like(o))
    torch.cuda.synchronize()
    raise SystemExit(0)
# fa3 mode's GQA work orders (session 38) alone: tile-major items (GPROJ_BWD_VARIANT 20 / 21),
# the group split over blocks (22, GPROJ_BWD_KV_SPLITS=2) and the row-range mask (23), d = 64 /
# 128, causal and a window that leaves the first key block to no query (its blocks have no items
# but still add to the split group's sums); and session 39's forms (24-28: release points,
# d = 64's dS~ addresses, d = 256's P under dP and stores by address)
# SANITIZE_VARIANTS=34,36,0s2,g0s4 keeps only those forms ("VsS": variant V with S shares; "g":
# gproj's d = 256 split group below), so that a round can check its new forms alone.
PICK = [t for t in os.environ.get("SANITIZE_VARIANTS", "").split(",") if t]


def picked(token):
    return not PICK or token in PICK


if os.environ.get("SANITIZE_ONLY_GQA_ORDERS") == "1":
    for variant, splits in (("20", ""), ("21", ""), ("22", ""), ("0", "2"), ("20", "2"),
                            ("23", ""), ("24", ""), ("25", ""), ("26", ""), ("27", ""),
                            ("28", ""), ("30", ""), ("0", "4"), ("32", ""), ("33", ""),
                            ("33", "2"), ("34", ""), ("36", ""),
                            ("37", ""), ("39", ""), ("40", "")):
        if not picked(variant + ("s" + splits if splits else "")):
            continue
        os.environ["GPROJ_BWD_VARIANT"] = variant
        os.environ["GPROJ_BWD_KV_SPLITS"] = splits
        for d in (64, 128, 256):
            # (variants 28 / 30 / 32 / 34 / 36 are d = 256's forms; the split group and 33's rotated
            # tiles run at every head dim)
            d256_form = variant in ("28", "30", "32", "34", "36")
            if (d == 256) != d256_form and not splits and variant != "33":
                continue
            if variant == "20" and d == 256:
                continue  # (no tile-major order in the d = 256 pass)
            if variant in ("39", "40") and d != 128:
                continue  # (the 80-row pass and variant 40's early lse2 are d = 128's)
            for nq, window in ((300, (-1, 0)), (77, (30, 0)), (300, (-1, -1))):
                q = torch.randn(2, nq, 8, d, device="cuda", dtype=torch.bfloat16,
                                requires_grad=True)
                k = torch.randn(2, 300, 2, d, device="cuda", dtype=torch.bfloat16,
                                requires_grad=True)
                o = gproj_cuda.attention(q, k, k, numerics="fa3", window_size=window)
                o.backward(torch.randn_like(o))
    # gproj's d = 256 split group (session 41): two shares and one block per query head, A in
    # one part (dK projected) and in two (variant 6)
    for variant, splits in (("0", "2"), ("0", "4"), ("6", "4")):
        if not picked(f"g{variant}s{splits}"):
            continue
        os.environ["GPROJ_BWD_VARIANT"] = variant
        os.environ["GPROJ_BWD_KV_SPLITS"] = splits
        for nq, window in ((300, (-1, 0)), (77, (30, 0)), (300, (-1, -1))):
            q = torch.randn(2, nq, 8, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn(2, 300, 2, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            o = gproj_cuda.attention(q, k, k, numerics="gproj", window_size=window)
            o.backward(torch.randn_like(o))
    torch.cuda.synchronize()
    raise SystemExit(0)
# The centering pre-passes (session 25: the keys' range probe, blocks of several chunks) alone:
# random and offset keys, dense (one and several chunks per block) and varlen with empty
# sequences, the keys' and the queries' rules, lazy flags and a given shift
if os.environ.get("SANITIZE_ONLY_CENTERING") == "1":
    from gproj_cuda.ops import center_keys_cuda
    lens = [0, 1, 127, 300, 0, 4196, 65]
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device="cuda")
    for d in (64, 128, 256):
        for offset in (0.0, 50.0):
            for shape, cuk, mk in (((2, 333, 3, d), None, None), ((4, 4196, 8, d), None, None),
                                   ((sum(lens), 3, d), cu, max(lens))):
                k = (torch.randn(*shape, device="cuda") + offset).to(torch.bfloat16)
                nseq = shape[0] if cuk is None else len(lens)
                flags = torch.empty((nseq, shape[-2]), dtype=torch.int32, device="cuda")
                _, shift = center_keys_cuda(k, cuk, mk, flags=flags)
                center_keys_cuda(k, cuk, mk, flags=flags, shift=shift)
                center_keys_cuda(k, cuk, mk, approx=True)
                center_keys_cuda(k, cuk, mk, shift_only=True, approx=True)
    torch.cuda.synchronize()
    raise SystemExit(0)
# The persistent forward's tile counter (session 15) alone: more query tiles than SMs under a
# causal mask, over as many keys and over fewer (the top tiles see none), every head dim and mode
if os.environ.get("SANITIZE_ONLY_TILES") == "1":
    # persistent, and (session 31) the one-tile d = 128 176-key and d = 256 80-key kernels with
    # the P.V wait inside the softmax over many key tiles; (session 43) d = 256's default,
    # persistent with O staged in the V stages (o_free's phases, tiles without keys among them)
    for d, variant in ((64, "8"), (64, "4"), (64, "9"), (128, "8"), (256, "3"), (128, "9"),
                       (256, "6"), (256, "7")):
        os.environ["GPROJ_FWD_VARIANT"] = variant
        for numerics in ("gproj", "fa3"):
            for nk in (1100, 300):
                # 16 heads: 32 (sequence, head) pairs, so that even 192-row tiles (d = 64, three
                # warpgroups: 6 per pair) outnumber the 132 SMs and the counter hands them out
                q = torch.randn(2, 1100, 16, d, device="cuda", dtype=torch.bfloat16)
                k = torch.randn(2, nk, 4, d, device="cuda", dtype=torch.bfloat16)
                gproj_cuda.attention(q, k, k, causal=True, numerics=numerics)
    # (session 32) 64 heads of 9 query tiles: the persistent schedule's remainder group (20 of
    # 64 pairs) first, and d = 256's 576 one-tile blocks by groups of pairs (tile_grid); and the
    # backward of these
    for d, variant in ((128, "8"), (256, "6")):
        os.environ["GPROJ_FWD_VARIANT"] = variant
        for numerics in ("gproj", "fa3"):
            q = torch.randn(1, 1100, 64, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn(1, 1100, 64, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            o = gproj_cuda.attention(q, k, k, causal=True, numerics=numerics)
            o.backward(torch.randn_like(o))
    torch.cuda.synchronize()
    raise SystemExit(0)
for variant in (() if ONLY_HOPPER_BWD else ("0", "1", "2", "3", "4", "5", "6", "7", "9", "12")):
    os.environ["GPROJ_FWD_VARIANT"] = variant
    for dtype in (torch.bfloat16, torch.float16):
        for d in (64, 128, 256):
            for numerics in ("gproj", "fa3"):
                for causal in (False, True):
                    if variant != "0" and not causal:
                        continue   # the variants only change the forward: one mask is enough
                    q = torch.randn(2, 77, 4, d, device="cuda", dtype=dtype, requires_grad=True)
                    k = torch.randn(2, 45, 2, d, device="cuda", dtype=dtype, requires_grad=True)
                    v = torch.randn(2, 45, 2, d, device="cuda", dtype=dtype, requires_grad=True)
                    o = gproj_cuda.attention(q, k, v, causal=causal, numerics=numerics,
                                             window_size=(30, -1))
                    o.backward(torch.randn_like(o))
os.environ["GPROJ_FWD_VARIANT"] = "0"
cu = torch.tensor([0, 5, 5, 70], dtype=torch.int32, device="cuda")
q = torch.randn(70, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
for numerics in ("gproj", "fa3"):
    o = gproj_cuda.attention_varlen(q, q, q, cu, cu, 65, 65, causal=True, numerics=numerics)
    o.backward(torch.randn_like(o))
if ONLY_FWD:
    torch.cuda.synchronize()
    raise SystemExit(0)

# Partial passes (ring attention's chunks): a query chunk of 40 rows against a key chunk of 56,
# diagonal moved both ways, fp32 chunk outputs, fp32/fp64 accumulators.
f32 = dict(dtype=torch.float32, device="cuda")
for d in (64, 128, 256):
    for numerics in ("gproj", "fa3"):
        for shift in (-20, 9):
            q = torch.randn(1, 40, 4, d, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(1, 56, 2, d, device="cuda", dtype=torch.bfloat16)
            v, do = torch.randn_like(k), torch.randn_like(q)
            kc = center_keys(k)[0] if numerics == "gproj" else k
            kw = dict(softmax_scale=d ** -0.5, numerics=numerics, causal=True, diag_shift=shift)
            o32, st = chunks.forward_chunk(q, kc, v, **kw)
            out = o32.to(q.dtype)
            dq_acc, pk_acc = torch.zeros(q.shape, **f32), torch.zeros(q.shape, **f32)
            rs_acc = torch.zeros(st.shape, dtype=torch.float64, device="cuda")
            rowstate = torch.zeros(st.shape[:-1] + (4,), **f32)
            chunks.backward_dq_chunk(do, q, kc, v, out, st, rowstate, dq_acc, pk_acc, rs_acc, **kw)
            chunks.finish_dq(dq_acc, pk_acc, rs_acc, rowstate, d ** -0.5, numerics, q.dtype)
            dk_acc, dv_acc = torch.zeros(k.shape, **f32), torch.zeros(k.shape, **f32)
            chunks.backward_dkdv_chunk(do, q, kc, v, st, rowstate, query_shift(q), dk_acc, dv_acc,
                                       **kw)

# The Hopper gproj λ pre-pass (backward_passes = 4; issue 7's first kernel), through the C API.
from gproj_cuda.ops import forward_cuda, rowstate_cuda
if torch.cuda.get_device_capability()[0] >= 9:
    for dtype in (torch.bfloat16, torch.float16):
        for d in (64, 128, 256):
            for causal in (False, True):
                q, do = (torch.randn(1, 77, 4, d, device="cuda", dtype=dtype) for _ in range(2))
                k, v = (torch.randn(1, 150, 2, d, device="cuda", dtype=dtype) for _ in range(2))
                wr = 0 if causal else -1
                out, _, stats = forward_cuda(q, k, v, None, None, 77, 150, d ** -0.5, -1, wr,
                                             "gproj")
                rowstate = rowstate_cuda(q, k, v, out, stats, do, d ** -0.5, -1, wr)
                torch.cuda.synchronize()
                assert torch.isfinite(rowstate[..., :3]).all(), "λ pre-pass left rows unwritten"

# The Hopper backward (d=64/128, then 256; GPROJ_HOPPER_BWD=1) in both numerics modes and every variant
# (GPROJ_BWD_VARIANT, csrc/api/variants.h), GQA, causal, odd lengths; one kv head and one query
# head carry an offset, so the lazy centering reads K' / Q' there and K / Q elsewhere.
if torch.cuda.get_device_capability()[0] == 9:
    os.environ["GPROJ_HOPPER_BWD"] = "1"
    # (a tuple: iterating the string "03456789" left out variant 10)
    variants = ("0", "3", "4", "5", "6", "7", "8", "9", "10")
    for numerics, causal, variant, d in itertools.product(("fa3", "gproj"), (False, True),
                                                           variants, (64, 128)):
        os.environ["GPROJ_BWD_VARIANT"] = variant
        q = torch.randn(2, 77, 4, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(2, 150, 2, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(2, 150, 2, d, device="cuda", dtype=torch.bfloat16)
        k[:, :, 1] += 40
        q[:, :, 2] += 20
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        o = gproj_cuda.attention(q, k, v, causal=causal, numerics=numerics)
        o.backward(torch.randn_like(o))
    os.environ["GPROJ_BWD_VARIANT"] = "0"
    # d=256: fa3 mode's KV-outer pass on 80-key blocks (bwd_kv_dkvt_sm90.cuh) and gproj's
    # head-dim-split one after the λ pre-pass (bwd_kv_split_sm90.cuh), GQA, causal and windowed, odd lengths (a partial last key tile and query tile),
    # one kv head and one query head with an offset (K' / Q' read there)
    for (numerics, dtype), (causal, window) in itertools.product(
            (("fa3", torch.bfloat16), ("fa3", torch.float16), ("gproj", torch.bfloat16)),
            ((False, (-1, -1)), (True, (-1, -1)), (False, (40, 7)))):
        q = torch.randn(2, 77, 4, 256, device="cuda", dtype=dtype)
        k = torch.randn(2, 150, 2, 256, device="cuda", dtype=dtype)
        v = torch.randn(2, 150, 2, 256, device="cuda", dtype=dtype)
        k[:, :, 1] += 40
        q[:, :, 2] += 20
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        o = gproj_cuda.attention(q, k, v, causal=causal, numerics=numerics, window_size=window)
        o.backward(torch.randn_like(o))
    os.environ["GPROJ_HOPPER_BWD"] = "0"
torch.cuda.synchronize()
print("sanitize case done")
