"""Build driver: setuptools runs CMake for the CUDA extension gproj_cuda._C.

Environment variables (all optional):
  GPROJ_HEADDIMS      head dims to compile, e.g. "64,128" (default "64,128,256")
  GPROJ_DTYPES        dtypes to compile, e.g. "bf16" (default "bf16,fp16")
  GPROJ_CUDA_ARCHS    GPU targets, e.g. "90a" (default "80,90a")
  GPROJ_BUILD_JOBS    parallel compile jobs (default: number of CPUs)
  GPROJ_SKIP_CUDA=1   install the pure-Python parts only (reference, emulator, study)
  GPROJ_PTXAS_VERBOSE=1  print per-kernel registers / spills while compiling
  GPROJ_FWD_VARIANTS=0   leave out the experimental Hopper forward variants (GPROJ_FWD_VARIANT
                         at run time); a faster build, same default kernel
Without nvcc the install still succeeds with the pure-Python parts and says so;
gproj_cuda.is_available() then explains why the kernels are missing.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent

# nvcc / CUTLASS lookup shared with the tests; loaded by path (the package needs torch to import)
_spec = importlib.util.spec_from_file_location("_gproj_toolchain",
                                               ROOT / "gproj_cuda" / "_toolchain.py")
_toolchain = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_toolchain)
_find_nvcc, _cutlass_include = _toolchain.find_nvcc, _toolchain.cutlass_include


def _list(name, default):
    raw = os.environ.get(name, default)
    return [x.strip() for x in raw.replace(";", ",").split(",") if x.strip()]


def _cmake():
    exe = shutil.which("cmake")
    if exe is None:
        try:
            import cmake  # the PyPI wheel
            exe = os.path.join(cmake.CMAKE_BIN_DIR, "cmake")
        except ImportError:
            pass
    return exe


def _drop_stale_cache(build_dir: Path):
    """pip builds in a fresh temporary environment each time; a CMake cache left by an earlier
    build points at tools (ninja, cmake) that no longer exist. Start over in that case."""
    cache = build_dir / "CMakeCache.txt"
    if not cache.exists():
        return
    for line in cache.read_text(errors="ignore").splitlines():
        if line.startswith(("CMAKE_MAKE_PROGRAM:", "CMAKE_COMMAND:")):
            tool = line.split("=", 1)[-1].strip()
            if tool and not os.path.exists(tool):
                shutil.rmtree(build_dir)
                build_dir.mkdir(parents=True)
                return


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def run(self):
        if os.environ.get("GPROJ_SKIP_CUDA") == "1":
            self._skip("GPROJ_SKIP_CUDA=1")
            return
        nvcc = _find_nvcc()
        if nvcc is None:
            self._skip("nvcc was not found (set CUDA_HOME or put nvcc on PATH)")
            return
        cmake = _cmake()
        if cmake is None:
            self._skip("cmake was not found (pip install cmake)")
            return
        for ext in self.extensions:
            self._build(ext, nvcc, cmake)

    def _skip(self, why):
        print("\n" + "=" * 78 + f"\ngproj_cuda: NOT building the CUDA kernels: {why}.\n"
              "Installing the pure-Python parts (float64 reference, CPU emulator, numerics study).\n"
              "gproj_cuda.is_available() will say why the kernels are missing.\n" + "=" * 78 + "\n",
              file=sys.stderr)
        self.extensions = []
        # A build directory reused from an earlier build with nvcc may still hold the module.
        for stale in (Path(self.build_lib) / "gproj_cuda").glob("_C*.so"):
            stale.unlink()

    def _build(self, ext, nvcc, cmake):
        import pybind11

        out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_tmp = Path(self.build_temp).resolve() / "cmake"
        build_tmp.mkdir(parents=True, exist_ok=True)
        _drop_stale_cache(build_tmp)
        cutlass = _cutlass_include()
        if cutlass is None:
            print("gproj_cuda: warning: nvidia-cutlass not found; building without CUTLASS headers",
                  file=sys.stderr)
        headdims = _list("GPROJ_HEADDIMS", "64,128,256")
        dtypes = _list("GPROJ_DTYPES", "bf16,fp16")
        archs = _list("GPROJ_CUDA_ARCHS", "80,90a")
        args = [
            f"-S{ROOT}", f"-B{build_tmp}",
            f"-DCMAKE_CUDA_COMPILER={nvcc}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY_RELEASE={out_dir}",
            "-DCMAKE_BUILD_TYPE=Release",
            "-DGPROJ_HEADDIMS=" + ";".join(headdims),
            "-DGPROJ_DTYPES=" + ";".join(dtypes),
            "-DGPROJ_CUDA_ARCHS=" + ";".join(archs),
            "-DGPROJ_PTXAS_VERBOSE=" + ("ON" if os.environ.get("GPROJ_PTXAS_VERBOSE") == "1" else "OFF"),
            "-DGPROJ_FWD_VARIANTS=" + ("OFF" if os.environ.get("GPROJ_FWD_VARIANTS") == "0" else "ON"),
        ]
        if cutlass:
            args.append(f"-DGPROJ_CUTLASS_INCLUDE={cutlass}")
        if shutil.which("ninja") or importlib.util.find_spec("ninja"):
            args.append("-GNinja")
            if not shutil.which("ninja"):
                import ninja
                args.append(f"-DCMAKE_MAKE_PROGRAM={os.path.join(ninja.BIN_DIR, 'ninja')}")
        jobs = os.environ.get("GPROJ_BUILD_JOBS", str(os.cpu_count() or 1))
        print(f"gproj_cuda: compiling head dims {headdims}, dtypes {dtypes}, archs {archs} "
              f"with {jobs} jobs", file=sys.stderr)
        subprocess.check_call([cmake, *args])
        subprocess.check_call([cmake, "--build", str(build_tmp), "-j", jobs])


setup(ext_modules=[CMakeExtension("gproj_cuda._C")], cmdclass={"build_ext": CMakeBuild})
