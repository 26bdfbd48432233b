"""The machine code of the built extension (issue 9): every Hopper kernel issues warpgroup GEMMs
(HGMMA) and loads by TMA, and no default Hopper kernel touches local memory (no register spills)
but those in KNOWN_SPILLING_DEFAULTS, kept for a measured reason. (The mma.sync kernels, the
sm_80 design that also runs the fp16-gproj and deterministic backward on Hopper, are outside
this: some spill 4-48 bytes, listed in bench/results/session9_2026-11-30/sass.md; session 28's
build in bench/results/session28_2026-12-03/sass.md.) Reads the SASS with cuobjdump + nvdisasm
(scripts/sass_check.py); CI installs them from the nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm wheels. Needs no GPU."""
import glob
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
import sass_check  # noqa: E402

# Instantiations that exist only for A/B runs (GPROJ_FWD_VARIANT / GPROJ_BWD_VARIANT) and are
# known to spill (bench/NOTES.md): the forward's persistent d = 256 kernel with pingpong (variant
# 12: 16 bytes since session 43, 88 before) and P through shared memory at d = 64 on 192-key tiles
# (variant 6: 24 bytes; 176-key tiles, variant 4, persistent d = 256 on 64-key tiles, variant 3,
# and variant 7's d = 64 160-key tiles spill nothing since session 43); the gproj KV-outer pass
# with dQ inside (variant 4 with two parts of A) and with three consumer warpgroups (variant 5);
# the Q-outer pass with 128-key tiles (variant 8); since session 12 (the block coordinates of
# tile_grid / grid_tile, no longer plain blockIdx reads, and the dQ writer warp) also 8-24 bytes
# in fa3 mode's 64-row d = 64 pass (variant 9), gproj's d = 64 pass with dQ inside (variant 4)
# and the d = 256 gproj pass with dK from two parts of A (variants 3, 4, 6); since session 25 fa3
# mode's d = 64 pass with per-warpgroup dQ (variant 13: the default's 36 bytes); since session 26
# the d = 128 one (variant 14) and fa3 mode's d = 64 pass with dQ split by head-dim halves
# (variant 15, the default before: 24 bytes). (BwdKvTraits' last parameters but the A/B bits: per-warpgroup
# dQ, true only in variants 13 and 14; dQ's GEMM split by query rows, true in fa3 mode's d = 64
# default.)
KNOWN_SPILLING_VARIANTS = (
    "FwdTraits<{t}, 256, 80, 2, true, true,",
    "FwdTraits<{t}, 64, 192,",
    "BwdKvTraits<{t}, 128, true, 2, true, 2, 64, false, false, 0>",
    "BwdKvTraits<{t}, 64, true, 1, false, 3, 64, false, false, 0>",
    "BwdKvTraits<{t}, 64, true, 2, false, 3, 64, false, false, 0>",
    "BwdKvTraits<{t}, 64, true, 3, false, 3, 64, false, false, 0>",
    "LambdaTraits<{t}, 64, 128, 2, true>",
    "BwdKvTraits<{t}, 64, false, 3, true, 2, 64, false, false, 0>",
    "BwdKvTraits<{t}, 64, true, 2, true, 2, 64, false, false, 0>",
    "BwdKvSplitTraits<{t}, 256, true, 2>",
    "BwdKvTraits<{t}, 64, false, 3, true, 2, 128, true, false, 0>",
    "BwdKvTraits<{t}, 128, false, 3, true, 2, 64, true, false, 0>",
    "BwdKvTraits<{t}, 64, false, 3, true, 2, 128, false, false, 0>",
    # (fa3 mode's d = 128 pass in its form before session 37, variant 18: the default's
    # producer-side spill)
    "BwdKvTraits<{t}, 128, false, 3, true, 2, 64, false, false, 3>",
    # (variant 38: fa3 mode's d = 128 pass as it was the default from session 37 to 41, the
    # diagonal tiles masked per element; its producer warpgroup's spill)
    "BwdKvTraits<{t}, 128, false, 3, true, 2, 64, false, false, 0>",
    # (variants 24 and 25, session 39: the stages freed at the tile's end, dO in its own ring;
    # the defaults' spills, d = 64 in its consumers, d = 128 4 bytes in its producer warpgroup.
    # Variants 26 and 27, the d = 64 pass's dS~ stores by address, alone and with 24, spill
    # nothing.)
    "BwdKvTraits<{t}, 64, false, 3, true, 2, 128, false, true, 8>",
    "BwdKvTraits<{t}, 64, false, 3, true, 2, 128, false, true, 24>",
    # (variant 31: fa3 mode's d = 64 pass as it was the default until session 39, dS~ through
    # CuTe's copy: 16 bytes of spill)
    "BwdKvTraits<{t}, 64, false, 3, true, 2, 128, false, true, 0>",
    "BwdKvTraits<{t}, 128, false, 3, true, 2, 64, false, false, 8>",
    "BwdKvTraits<{t}, 128, false, 3, true, 2, 64, false, false, 24>",
    # (variant 33, session 41: the rotated item order's extra register; d = 64 16 bytes in its
    # consumers, 3 local loads and 1 store per tile, L1 hits; d = 128 the default's producer-
    # side spill)
    "BwdKvTraits<{t}, 64, false, 3, true, 2, 128, false, true, 104>",
    "BwdKvTraits<{t}, 128, false, 3, true, 2, 64, false, false, 64>",
    # (variant 37, session 42: every consumer warp copies a share of the row state; d = 128 keeps
    # 8 bytes of the default's producer-warpgroup spill, one store and one load in each of two
    # places after its setmaxnreg.dealloc; d = 64's kernel spills nothing)
    "BwdKvTraits<{t}, 128, false, 3, true, 2, 64, false, false, 128>",
    # (variant 39, session 44: fa3 mode's d = 128 pass on 80 x 128 tiles, dQ transposed; 8 bytes
    # in its producer warpgroup, one store and one load in each of two places, as the default's)
    "BwdKvTraits<{t}, 128, false, 3, true, 2, 80, false, false, 0>",
    # (variant 40, session 45: the d = 128 default with lse2 read before the wait for S; the
    # default's 8 bytes in its producer warpgroup)
    "BwdKvTraits<{t}, 128, false, 3, true, 2, 64, false, false, 260>",
)
# Default kernels that spill, by choice: the KV-outer pass at d = 64 with 128-row query tiles
# (FlashAttention-3's 128 x 128 tile there) keeps S^T, dP^T, dK and dV (192 registers) live through
# the elementwise pass and spills loop invariants (thread coordinates, addresses): fa3 mode ~50
# bytes (~12 local loads per tile, L1 hits), gproj ~20 (none since session 23, whose A = P (dP -
# (delta + lambda)) needs fewer live values; fa3 mode's 40 -> 24 bytes since lse2 comes from
# rowstate). Measured faster than the same pass with
# fewer rows and no spill (bench/NOTES.md, session 11): fa3 mode 4-11% against 64 rows
# (GPROJ_BWD_VARIANT=9), gproj 1.3-5.6% against 96 (GPROJ_BWD_VARIANT=10); session 12's block
# coordinates (grid_tile) add 8 bytes to each, and session 21's wait for the λ pass's rows
# (csrc/common/pdl.cuh) 4 more to gproj's (24-byte stack, 7 local loads and 6 stores); session
# 22's waits and counts in fa3 mode's (delta's rows, dQ's keys) take it from 15 local loads and
# 12 stores to 25 and 14 (40-byte stack), 2 more loads per key tile in the loop. A third since
# session 12: fa3 mode's d = 128 pass, whose producer warpgroup also holds the dQ writer warp within
# its 24 registers; the producer warpgroup spills 16 bytes (~6 local loads per query tile, L1 hits,
# off the consumers' path; 28 bytes since session 18's two dQ staging buffers, the writer's loop
# too); the writer measured 2-4% faster for the whole fa3 backward (bench/NOTES.md, session 12). A
# fourth since session 13: gproj's d = 128 λ + dQ pass, whose WGMMA descriptors are now built in
# uniform registers (warpgroup_slice, csrc/common/sm90.cuh), spills 8 bytes outside its key-tile
# loop (one store and four loads per query tile), while the loop is 5.6% shorter (838 -> 791 SASS
# instructions per key tile). A fifth since session 28: fa3 mode's d = 256 pass on 80-key blocks
# with dK and dV transposed (csrc/backward/bwd_kv_dkvt_sm90.cuh) spills 8 bytes (one local load
# per query tile, an L1 hit); it measured 2-9% faster than the head-dim-split pass it replaced,
# which does not spill (bench/NOTES.md, session 28). Both of its tile orders (kDvFirst, session
# 29) match the one pattern. (From session 36 to 42 a sixth: the d = 256 forward, persistent on
# 80-key tiles without pingpong, variant 7, 80 bytes of per-tile values, the epilogue's and
# q . shift's addresses and the producer's tile loop state; none since session 43: those addresses
# walked from one base, the ring positions as counts, bench/NOTES.md session 43.)
KNOWN_SPILLING_DEFAULTS = (
    # (fa3 mode's d = 256 80-key pass, listed here from session 28, spills nothing since session
    # 41's item cursor, in any of its forms: no longer exempt)
    # (since session 42 the d = 128 pass masks its diagonal tiles by key-row ranges, variant 23's
    # form: 4 bytes in its producer warpgroup)
    "BwdKvTraits<{t}, 128, false, 3, true, 2, 64, false, false, 4>",
    "LambdaTraits<{t}, 128, 64, 3, true>",
)


def _library():
    try:
        import gproj_cuda
    except ImportError:
        return None
    libs = sorted(glob.glob(os.path.join(os.path.dirname(gproj_cuda.__file__), "_C*.so")))
    return libs[0] if libs else None


@pytest.fixture(scope="module")
def kernels():
    lib = _library()
    if lib is None:
        pytest.skip("the CUDA extension is not built")
    if not (sass_check.find_tool("cuobjdump", False) and sass_check.find_tool("nvdisasm", False)):
        pytest.skip("cuobjdump / nvdisasm not found (pip install nvidia-cuda-cuobjdump "
                    "nvidia-cuda-nvdisasm)")
    counts = sass_check.sass_counts(lib, sass_check.find_tool("cuobjdump"))
    names = sass_check.demangle(list(counts))
    rows = {sass_check.short(names[m]): c for m, c in counts.items()}
    if not any("sm90" in k for k in rows):
        pytest.skip("no sm_90a kernels in this build")
    return rows


def test_every_hopper_kernel_issues_hgmma(kernels):
    sm90 = {k: c for k, c in kernels.items() if "sm90" in k}
    missing = [k for k, c in sm90.items() if c["HGMMA"] == 0]
    assert not missing, f"Hopper kernels without HGMMA: {missing}"
    # the forward and both backward passes load their tiles by TMA
    for k, c in sm90.items():
        assert c["UTMALDG"] > 0, f"{k}: no TMA load"


def test_default_hopper_kernels_do_not_spill(kernels):
    allowed = [v.format(t=t) for v in KNOWN_SPILLING_VARIANTS + KNOWN_SPILLING_DEFAULTS
               for t in ("bf16", "fp16")]
    spilling = [k for k, c in kernels.items() if "sm90" in k and (c["LDL"] or c["STL"])]
    unexpected = [k for k in spilling if not any(a in k for a in allowed)]
    assert not unexpected, f"kernels with local-memory instructions: {unexpected}"


def test_hopper_kernels_address_shared_memory_explicitly(kernels):
    """No generic loads or stores (LD / ST) in the Hopper kernels. An address that a swizzled CuTe
    layout computes (an XOR of address bits) hides its shared-memory space from the compiler,
    which then emits generic LD / ST, slower than LDS / STS; csrc/common/sm90.cuh's
    ld_shared_v4 / st_shared_v4 state the space. gproj's d = 256 in-place Q' was such a loop:
    explicit, it made that backward 4-6% faster (bench/NOTES.md session 19)."""
    generic = [k for k, c in kernels.items() if "sm90" in k and (c["LD"] or c["ST"])]
    assert not generic, f"Hopper kernels with generic LD / ST: {generic}"


def test_sass_loop_reads_loops_and_skips():
    """scripts/sass_loop.py's parsing on a hand-written SASS fragment: one loop (the branch back
    to 0x0010), its opcode histogram with and without the range a forward branch skips."""
    import sass_loop
    text = """
        Function : _Z1kv
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*0020*/              @!P0 BRA 0x50 ;
        /*0030*/                   FSEL R2, R3, RZ, P1 ;
        /*0040*/                   FSEL R4, R5, RZ, P1 ;
        /*0050*/                   MUFU.EX2 R6, R6 ;
        /*0060*/               @P2 BRA 0x10 ;
        /*0070*/                   EXIT ;
    """.splitlines()
    instrs = sass_loop.parse(text)["_Z1kv"]
    assert len(instrs) == 8
    assert sass_loop.loops(instrs) == [(0x10, 0x60)]
    n, hist = sass_loop.histogram(instrs, 0x10, 0x60)
    assert n == 6 and hist["FSEL"] == 2 and hist["BRA"] == 2 and hist["HGMMA"] == 1
    assert sass_loop.forward_skips(instrs, 0x10, 0x60) == [(0x20, 0x50)]
    n, hist = sass_loop.histogram(instrs, 0x10, 0x60, exclude=[(0x30, 0x50)])
    assert n == 4 and "FSEL" not in hist
