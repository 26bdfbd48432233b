"""Host-side C++ checks of kernel index arithmetic that CuTe can verify without a GPU (nvcc and
the nvidia-cutlass headers needed; skipped without them)."""
import os
import subprocess

import pytest

from gproj_cuda._toolchain import cutlass_include, find_nvcc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_and_run(tmp_path, name):
    """Compile tests/host/NAME.cu for the host and run it; it must print "all checks passed"."""
    nvcc, inc = find_nvcc(), cutlass_include()
    if nvcc is None or inc is None:
        pytest.skip("needs nvcc and the nvidia-cutlass headers")
    exe = tmp_path / name
    build = subprocess.run(
        [nvcc, "-std=c++17", "-O1", "--expt-relaxed-constexpr", "-I", inc,
         os.path.join(ROOT, "tests", "host", name + ".cu"), "-o", str(exe)],
        capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-1000:]
    assert "all checks passed" in run.stdout


def test_dq_accum_layout_matches_cute(tmp_path):
    """csrc/common/tile.cuh's dq_accum tile layout against CuTe's WGMMA accumulator partition
    (tests/host/dq_accum_layout.cu says what is checked)."""
    build_and_run(tmp_path, "dq_accum_layout")


def test_fa3_ds_store_addresses_match_cute(tmp_path):
    """The fa3-mode KV-outer pass's dS~ stmatrix addresses (csrc/backward/bwd_kv_sm90.cuh,
    kDsByAddress: a lane's base XOR 32 k, stage by stage) against CuTe's partition of the kernel's
    own layout and copy (tests/host/ds_store_addresses.cu says what is checked)."""
    build_and_run(tmp_path, "ds_store_addresses")


def test_kv_item_cursor_matches_key_block_work(tmp_path):
    """The KV-outer consumers' item cursor against KeyBlockWork::head / tile (the producer's and
    the dQ writer's), head-major and tile-major (tests/host/kv_item_order.cu says what is
    checked)."""
    build_and_run(tmp_path, "kv_item_order")


def test_masked_tile_row_ranges_match_visible(tmp_path):
    """The KV-outer passes' per-row masks of cut tiles (mask_row_ranges over Mask::row_queries /
    row_columns, in the form each pass picks) zero exactly the scores Mask::visible hides, in
    each pass's own accumulator partition, for random masks and tiles
    (tests/host/mask_ranges.cu)."""
    build_and_run(tmp_path, "mask_ranges")


def test_forward_q_chunk_addresses_match_cute(tmp_path):
    """The forward's walks over Q-buffer chunks by shared address (csrc/forward/fwd_sm90.cuh,
    FwdTraits::q_chunk_addr for q . shift, o_row_addr for O's copy where TMA cannot store it)
    against CuTe's SmemLayoutQ, every thread and forward variant (tests/host/q_chunk_addresses.cu
    says what is checked)."""
    build_and_run(tmp_path, "q_chunk_addresses")
