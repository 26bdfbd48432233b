"""What the compiled kernels are made of, read from their SASS (issue 9 asks for it): per kernel,
the registers, the stack frame, the Hopper instructions that carry the design (HGMMA: the warpgroup
GEMMs; UTMALDG / UTMASTG: TMA loads and stores; UBLKCP / UBLKRED: bulk copies and reduce-adds)
and any local-memory traffic (LDL / STL: register spills, or arrays the compiler could not keep in
registers). Needs `cuobjdump` and `nvdisasm` (the nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm
wheels have them; this looks on PATH, then in those wheels' folders).

    python scripts/sass_check.py [LIBRARY.so] [--filter sm90] [--md FILE] [--json FILE]

Exit status 1 if a kernel whose name matches --require-clean (a regex) has local-memory
instructions or, for Hopper kernels, no HGMMA."""
import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys

# (LD, ST: generic loads and stores, "LD.E..." / "ST.E..."; LDS / LDG / LDL are not counted as LD)
OPS = ("HGMMA", "UTMALDG", "UTMASTG", "UBLKCP", "UBLKRED", "LDL", "STL", "BAR.SYNC", "SYNCS", "LD",
       "ST")


def find_tool(name, required=True):
    path = shutil.which(name)
    if path:
        return path
    for p in sys.path:
        cand = os.path.join(p, "nvidia", "cu13", "bin", name)
        if os.path.exists(cand):
            return cand
    if not required:
        return None
    raise SystemExit(f"{name} not found: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm, "
                     "or put the CUDA toolkit's bin/ on PATH")


def demangle(names):
    cxxfilt = shutil.which("c++filt")
    if not cxxfilt:
        return dict(zip(names, names))
    out = subprocess.run([cxxfilt], input="\n".join(names), capture_output=True, text=True).stdout
    return dict(zip(names, out.splitlines()))


def short(name):
    """The kernel and its template arguments, without namespaces and cute noise."""
    s = re.sub(r"\bgproj::(sm90::)?", "", name)
    s = s.replace("__nv_bfloat16", "bf16").replace("__half", "fp16")
    s = re.sub(r"\(.*\)$", "", s)
    return re.sub(r"void ", "", s)


def sass_counts(lib, cuobjdump):
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(find_tool("nvdisasm")) + os.pathsep + env.get("PATH", "")
    proc = subprocess.Popen([cuobjdump, "-sass", lib], stdout=subprocess.PIPE, text=True, env=env)
    counts, cur = {}, None
    for line in proc.stdout:
        if "Function :" in line:
            cur = line.split("Function :")[1].strip()
            counts[cur] = collections.Counter()
            continue
        if cur is None or "/*" not in line:
            continue
        m = re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", line)
        if m:
            op = m.group(1)
            for o in OPS:
                if op == o or op.startswith(o + "."):
                    counts[cur][o] += 1
            counts[cur]["all"] += 1
    if proc.wait() != 0:
        raise SystemExit("cuobjdump -sass failed")
    return counts


def res_usage(lib, cuobjdump):
    out = subprocess.run([cuobjdump, "-res-usage", lib], capture_output=True, text=True).stdout
    res, cur = {}, None
    for line in out.splitlines():
        m = re.search(r"Function (\S+):", line)
        if m:
            cur = m.group(1)
            continue
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)", line)
        if m and cur:
            res[cur] = tuple(int(x) for x in m.groups())
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lib", nargs="?", help="the extension (default: gproj_cuda/_C*.so)")
    ap.add_argument("--filter", default="", help="regex on the demangled kernel name")
    ap.add_argument("--require-clean", default="",
                    help="regex: matching kernels must have no LDL/STL and (sm90) some HGMMA")
    ap.add_argument("--md", help="write the table as Markdown here")
    ap.add_argument("--json", help="write the counts as JSON here")
    args = ap.parse_args(argv)
    lib = args.lib
    if not lib:
        import glob
        here = os.path.dirname(os.path.abspath(__file__))
        libs = sorted(glob.glob(os.path.join(here, "..", "gproj_cuda", "_C*.so")))
        if not libs:
            raise SystemExit("no gproj_cuda/_C*.so: build the extension or name the library")
        lib = libs[0]
    cuobjdump = find_tool("cuobjdump")
    print(f"reading SASS of {lib} ...", flush=True)
    counts = sass_counts(lib, cuobjdump)
    res = res_usage(lib, cuobjdump)
    names = demangle(list(counts))
    rows, bad = [], []
    for mangled, c in counts.items():
        name = short(names[mangled])
        if args.filter and not re.search(args.filter, name):
            continue
        reg, stack, smem = res.get(mangled, (-1, -1, -1))
        row = dict(kernel=name, registers=reg, stack_bytes=stack, static_smem=smem,
                   instructions=c["all"], **{o: c[o] for o in OPS})
        rows.append(row)
        if args.require_clean and re.search(args.require_clean, name):
            if c["LDL"] or c["STL"] or ("sm90" in name and not c["HGMMA"]):
                bad.append(name)
    rows.sort(key=lambda r: r["kernel"])
    cols = ["registers", "stack_bytes", "instructions", "HGMMA", "UTMALDG", "UTMASTG", "UBLKCP",
            "UBLKRED", "LDL", "STL"]
    lines = ["| kernel | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for r in rows:
        lines.append(f"| `{r['kernel']}` | " + " | ".join(str(r[c]) for c in cols) + " |")
    table = "\n".join(lines)
    print(table)
    n_local = sum(1 for r in rows if r["LDL"] or r["STL"])
    n_hgmma = sum(1 for r in rows if r["HGMMA"])
    print(f"\n{len(rows)} kernels: {n_hgmma} with HGMMA, {n_local} with local-memory "
          "instructions (LDL/STL)")
    if args.md:
        with open(args.md, "w") as f:
            f.write(f"SASS of `{os.path.basename(lib)}` (`python scripts/sass_check.py`)\n\n"
                    + table + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if bad:
        print("kernels that fail --require-clean:\n  " + "\n  ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
