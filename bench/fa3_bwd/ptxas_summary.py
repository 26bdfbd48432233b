#!/usr/bin/env python3
"""Summarize `ptxas -v` output: registers / spills / smem per kernel (demangled names shortened)."""
import re, subprocess, sys
rows = []
for path in sys.argv[1:]:
    cur = None
    for line in open(path, errors="replace"):
        m = re.search(r"Compiling entry function '([^']+)' for '(sm_\w+)'", line)
        if m: cur = m.group(1); spill = ""; continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur: spill = f"stack={m.group(1)} spill_st={m.group(2)} spill_ld={m.group(3)}"; continue
        m = re.search(r"Used (\d+) registers(.*)", line)
        if m and cur:
            rows.append((path, cur, m.group(1), spill, m.group(2).strip(", "))); cur = None
names = [r[1] for r in rows]
try:
    dem = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
except Exception:
    dem = names
print("hdim-file | kernel | tile (M x N [x K]) | variant | regs / stack / spills")
print("(mainloop kernels use setmaxnreg: producer WG 24, MMA WGs 240 regs; regs=168 is the launch allocation for 384 thr)")
for (path, mangled, regs, spill, rest), d in zip(rows, dem):
    kind = 'preprocess' if 'Preprocess' in d else ('postprocess' if 'Postprocess' in d else 'mainloop')
    m = re.search(r'tuple<cute::C<(\d+)>, cute::C<(\d+)>, cute::C<(\d+)> >, cutlass::bfloat16_t, float, cutlass::arch::Sm90', d) or re.search(r'tuple<cute::C<(\d+)>, cute::C<(\d+)> >', d)
    tile = 'x'.join(m.groups()) if m else '?'
    var = ''
    if kind == 'mainloop':
        a = re.search(r'arch::Sm90, (\w+),', d)
        var = ('causal' if a and a.group(1) == 'true' else 'non-causal') + (' GQA' if 'EpilogueBwdGQA' in d else '')
    print(f"{path} | {kind} | {tile} | {var} | regs={regs} {spill} {rest}")
print()
print("=== full ===")
for (path, mangled, regs, spill, rest), d in zip(rows, dem):
    short = d
    for a, b in [("cutlass::device_kernel<", ""), ("flash::enable_sm90_or_later<", ""), ("cute::", ""), ("cutlass::", "")]:
        short = short.replace(a, b)
    print(f"{path}: regs={regs} {spill} {rest}\n    {short[:400]}\n    mangled={mangled}")
