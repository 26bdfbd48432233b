"""The loops of one kernel, instruction by instruction class, read from its SASS: how session 37
compared fa3 mode's backward loop with FlashAttention-3's (bench/NOTES.md session 37 item 3:
same structure, 17% more instructions, 17% more cycles). For every loop (a backward branch) it
prints the address range, the instruction count and the opcode histogram; --exclude drops
address ranges (e.g. a masked path the unmasked tiles branch over), and --skips lists the loop's
forward branches, the candidates for it.

    python scripts/sass_loop.py LIBRARY.so REGEX [--exclude 4370-5c30 ...] [--skips] [--top 40]

REGEX matches the demangled kernel name (the first match is read; --list shows them all).
Needs cuobjdump and nvdisasm (scripts/sass_check.py finds them)."""
import argparse
import collections
import os
import re
import subprocess

from sass_check import demangle, find_tool

INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"\bBRA\s+(?:`?\(?)?(?:!?U?P[T\d],\s*)?0x([0-9a-f]+)")


def parse(lines):
    """Kernel name -> [(address, instruction text)] from `cuobjdump -sass` output lines."""
    funcs, cur = {}, None
    for line in lines:
        if "Function :" in line:
            cur = line.split("Function :")[1].strip()
            funcs[cur] = []
            continue
        m = INSTR.search(line)
        if cur is not None and m:
            funcs[cur].append((int(m.group(1), 16), m.group(2)))
    return funcs


def opcode(text):
    """The instruction's opcode without its modifiers (predicate dropped): 'HGMMA', 'LDS', ..."""
    words = text.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def loops(instrs):
    """(start, end) of every loop: a branch back to an earlier address, end inclusive."""
    out = []
    for addr, text in instrs:
        m = BRANCH.search(text)
        if m and int(m.group(1), 16) <= addr:
            out.append((int(m.group(1), 16), addr))
    return out


def histogram(instrs, lo, hi, exclude=()):
    body = [(a, t) for a, t in instrs if lo <= a <= hi and not any(x <= a < y for x, y in exclude)]
    return len(body), collections.Counter(opcode(t) for _, t in body)


def forward_skips(instrs, lo, hi):
    """Forward branches inside [lo, hi]: (from, to), the ranges a path may skip."""
    out = []
    for addr, text in instrs:
        m = BRANCH.search(text)
        if lo <= addr <= hi and m and lo < int(m.group(1), 16) <= hi + 16 and int(m.group(1), 16) > addr:
            out.append((addr, int(m.group(1), 16)))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lib")
    ap.add_argument("regex", nargs="?", default="")
    ap.add_argument("--exclude", nargs="*", default=[], metavar="LO-HI",
                    help="hex address ranges to leave out of every loop's count")
    ap.add_argument("--skips", action="store_true", help="list each loop's forward branches")
    ap.add_argument("--list", action="store_true", help="list the matching kernels only")
    ap.add_argument("--top", type=int, default=40, help="opcodes shown per loop")
    args = ap.parse_args(argv)
    cuobjdump = find_tool("cuobjdump")
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(find_tool("nvdisasm")) + os.pathsep + env.get("PATH", "")
    out = subprocess.run([cuobjdump, "-sass", args.lib], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit("cuobjdump -sass failed: " + out.stderr[-500:])
    funcs = parse(out.stdout.splitlines())
    names = demangle(list(funcs))
    match = [m for m in funcs if re.search(args.regex, names[m])]
    if not match:
        raise SystemExit(f"no kernel matches {args.regex!r} ({len(funcs)} kernels)")
    if args.list:
        for m in match:
            print(f"{len(funcs[m]):6d} instructions  {names[m][:200]}")
        return
    mangled = match[0]
    instrs = funcs[mangled]
    exclude = [tuple(int(x, 16) for x in r.split("-")) for r in args.exclude]
    print(f"{names[mangled][:300]}\n{len(instrs)} instructions")
    for lo, hi in loops(instrs):
        n, hist = histogram(instrs, lo, hi, exclude)
        print(f"\nloop {lo:#06x}-{hi:#06x}: {n} instructions" + (" (after --exclude)" if exclude else ""))
        print("  " + ", ".join(f"{k} {v}" for k, v in hist.most_common(args.top)))
        if args.skips:
            for a, b in forward_skips(instrs, lo, hi):
                print(f"  forward branch at {a:#06x} to {b:#06x} ({(b - a) // 16} instructions)")


if __name__ == "__main__":
    main()
