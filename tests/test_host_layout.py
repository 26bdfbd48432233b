"""Host-side C++ checks of kernel index arithmetic that CuTe can verify without a GPU (nvcc and
the nvidia-cutlass headers needed; skipped without them)."""
import importlib.util
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _nvcc():
    for cand in (os.environ.get("CUDACXX"), shutil.which("nvcc"),
                 os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")):
        if cand and os.path.isfile(cand):
            return cand
    return None


def _cutlass_include():
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        return None
    inc = os.path.join(list(spec.submodule_search_locations)[0], "source", "include")
    return inc if os.path.isdir(inc) else None


def test_dq_accum_layout_matches_cute(tmp_path):
    """csrc/common/tile.cuh's dq_accum tile layout against CuTe's WGMMA accumulator partition
    (tests/host/dq_accum_layout.cu says what is checked)."""
    nvcc, inc = _nvcc(), _cutlass_include()
    if nvcc is None or inc is None:
        pytest.skip("needs nvcc and the nvidia-cutlass headers")
    exe = tmp_path / "dq_accum_layout"
    build = subprocess.run(
        [nvcc, "-std=c++17", "-O1", "--expt-relaxed-constexpr", "-I", inc,
         os.path.join(ROOT, "tests", "host", "dq_accum_layout.cu"), "-o", str(exe)],
        capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-1000:]
    assert "all checks passed" in run.stdout
