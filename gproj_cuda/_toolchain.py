"""Where the build tools are: nvcc and the CuTe/CUTLASS headers of the nvidia-cutlass wheel.
Standard library only, so setup.py can load this file by path before the package (or torch) is
importable; tests/test_host_layout.py uses it too."""
import importlib.util
import os
import shutil
from pathlib import Path


def find_nvcc():
    """$CUDACXX, nvcc on the PATH, or $CUDA_HOME/bin/nvcc (default /usr/local/cuda); None."""
    for cand in (os.environ.get("CUDACXX"), shutil.which("nvcc"),
                 os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")):
        if cand and os.path.isfile(cand):
            return cand
    return None


def cutlass_include():
    """The include folder of the installed nvidia-cutlass wheel (located without importing its
    Python package, whose dependencies the headers do not need); None."""
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        return None
    inc = Path(list(spec.submodule_search_locations)[0]) / "source" / "include"
    return str(inc) if (inc / "cute").is_dir() else None


if __name__ == "__main__":  # scripts/devbuild.sh: print the CUTLASS include folder
    print(cutlass_include() or "")
