#!/usr/bin/env python3
"""What ptxas and the SASS say about the CUDA kernel instances, on a machine without a GPU, and
how that compares with another commit: the check to make before a kernel change takes device
time (registers, spills, wgmma serialization, the HGMMA and wait counts a change meant to move).

  scripts/sass_report.py [--build DIR] [--base REV] [--arch 90a] INSTANCE...

INSTANCE is a file of lib/cuda/instances without its .cu (sm90_bwd_hdim128_bf16) or a glob of
them (sm90_fwd_*_bf16). Each is compiled with the build's own command (DIR: a configured CUDA
build of this tree, default build-local) for the one arch only, with ptxas -v. For each kernel
it prints registers, spill bytes, stack frame, HGMMA, WARPGROUP.ARRIVE and WARPGROUP.DEPBAR
counts and the instruction count; ptxas's C75xx notes (C7515 and C7520 mean serialized wgmmas)
after the table. --base REV: the same kernels at REV (a temporary git worktree), a row each
beside the tree's, and whether the SASS is identical (addresses aside).

Needs cuobjdump and the nvdisasm it calls for SASS: on PATH, in the CUDA toolkit's bin, or in
the wheels of the Python that runs it (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm).
"""
import argparse
import fnmatch
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def find_cuobjdump():
    found = shutil.which("cuobjdump")
    if found:
        return found
    # The CUDA toolkit's bin, then the nvidia wheels of this Python's environment.
    candidates = ["/usr/local/cuda/bin/cuobjdump"]
    for path in sys.path:
        candidates += sorted(glob.glob(os.path.join(path, "nvidia", "*", "bin", "cuobjdump")))
    for cand in candidates:
        if os.access(cand, os.X_OK):
            return cand
    sys.exit("sass_report: no cuobjdump found (PATH, /usr/local/cuda/bin, this Python's nvidia wheels)")


def compile_commands(build):
    """The build's compile command of each instance, by instance name."""
    out = subprocess.run(["ninja", "-C", build, "-t", "commands"], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"sass_report: ninja -t commands failed in {build}: {out.stderr.strip()}")
    cmds = {}
    for line in out.stdout.splitlines():
        m = re.search(r"-c (\S*/lib/cuda/instances/(\w+)\.cu) ", line)
        if m:
            cmds[m.group(2)] = line
    return cmds


def one_arch(cmd, arch, src_root, obj):
    """The compile command for one arch, -Xptxas -v, sources from src_root, output obj."""
    words = shlex.split(cmd)
    keep = []
    skip = False
    for w in words:
        if skip:
            skip = False
            continue
        if w.startswith("-gencode=") or w in ("-MD",):
            continue
        if w in ("-MT", "-MF", "-o"):
            skip = True
            continue
        if w.endswith("ptxas_guard.sh"):
            continue  # its verdict is printed below instead
        keep.append(w.replace(ROOT + "/", src_root + "/"))
    code = arch if arch.startswith("sm_") else f"sm_{arch}"
    compute = code.replace("sm_", "compute_")
    return keep + [f"-gencode=arch={compute},code={code}", "-Xptxas=-v", "-o", obj]


def report(cmd, cuobjdump, build):
    """{kernel: stats}, the C75xx notes and {kernel: SASS text} of one compile."""
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=build)
    if res.returncode != 0:
        sys.exit("sass_report: compile failed:\n" + res.stderr[-3000:])
    stats, notes = {}, []
    current = None
    for line in res.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            current = m.group(1)
            stats[current] = {"regs": 0, "spill_st": 0, "spill_ld": 0, "stack": 0}
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and current:
            stats[current].update(stack=int(m.group(1)), spill_st=int(m.group(2)), spill_ld=int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            stats[current]["regs"] = int(m.group(1))
        if re.search(r"\bC75\d\d\b", line):
            notes.append(re.sub(r"^ptxas \w+\s*: ", "", line.strip()))
    obj = cmd[-1]
    sass = subprocess.run([cuobjdump, "-sass", obj], capture_output=True, text=True).stdout
    bodies = {}
    for chunk in re.split(r"\n\s*Function : ", sass)[1:]:
        name = chunk.split("\n", 1)[0].strip()
        body = [re.sub(r"/\*[0-9a-f]{4,}\*/|0x[0-9a-f]+", "", l).strip()
                for l in chunk.splitlines()[1:] if re.match(r"\s+/\*[0-9a-f]{4,}\*/", l)]
        bodies[name] = body
        s = stats.setdefault(name, {"regs": 0, "spill_st": 0, "spill_ld": 0, "stack": 0})
        s["instr"] = len(body)
        s["hgmma"] = sum("HGMMA" in l for l in body)
        s["arrive"] = sum("WARPGROUP.ARRIVE" in l for l in body)
        s["depbar"] = sum("WARPGROUP.DEPBAR" in l for l in body)
    return stats, notes, bodies


def short(name):
    """A kernel's mangled name shortened to what tells the instances apart: the function's own
    name, its element type, head dim and backward loop."""
    ident = None
    pos = name.find("N") + 1  # _ZN: the nested name's length-prefixed parts
    while 0 < pos < len(name):
        m = re.match(r"(\d+)", name[pos:])
        if not m:
            break
        start = pos + len(m.group(1))
        word = name[start:start + int(m.group(1))]
        pos = start + len(word)
        if word.endswith("_kernel"):
            ident = word
            break
    dtype = "bf16" if "bfloat16" in name else "fp16" if "half" in name else ""
    dim = re.search(r"Li(\d+)E", name)
    loop = re.search(r"BwdLoopE(\d)", name)
    long_rows = re.search(r"Li\d+ELb1E", name)  # the forward's long-row tile (kLongRows)
    parts = [ident or name[:40], dtype, f"d{dim.group(1)}" if dim else "",
             {"0": "plain", "1": "biased", "2": "general"}.get(loop.group(1), "") if loop else "",
             "long rows" if long_rows else ""]
    return " ".join(x for x in parts if x)


def fmt(s):
    spill = f"{s['spill_st']}/{s['spill_ld']}" if s["spill_st"] or s["spill_ld"] else "-"
    return (f"{s['regs']:>4} {spill:>9} {s['stack']:>5} {s.get('hgmma', 0):>5} "
            f"{s.get('arrive', 0):>6} {s.get('depbar', 0):>6} {s.get('instr', 0):>7}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("instances", nargs="+")
    ap.add_argument("--build", default=os.path.join(ROOT, "build-local"))
    ap.add_argument("--base", help="a commit to compare with")
    ap.add_argument("--arch", default="90a")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    cmds = compile_commands(build)
    names = sorted({n for pat in a.instances for n in cmds if fnmatch.fnmatch(n, pat)})
    if not names:
        sys.exit(f"sass_report: no instance of {build} matches {a.instances} "
                 f"(known: {', '.join(sorted(cmds)[:6])}, ...)")
    cuobjdump = find_cuobjdump()
    tmp = tempfile.mkdtemp(prefix="sass-report-")
    base_root = None
    try:
        if a.base:
            base_root = os.path.join(tmp, "base")
            subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-q", base_root, a.base],
                           check=True)
        header = f"{'kernel':<34} {'regs':>4} {'spills st/ld':>9} {'stack':>5} {'HGMMA':>5} {'ARRIVE':>6} {'DEPBAR':>6} {'instr':>7}"
        print(header)
        all_notes = []
        for n in names:
            tree = report(one_arch(cmds[n], a.arch, ROOT, os.path.join(tmp, n + ".o")),
                          cuobjdump, build)
            base = None
            if base_root and not os.path.exists(
                    os.path.join(base_root, "lib", "cuda", "instances", n + ".cu")):
                print(f"{n}: no such instance at {a.base[:12]}")
            elif base_root:
                base = report(one_arch(cmds[n], a.arch, base_root, os.path.join(tmp, n + "-base.o")),
                              cuobjdump, build)
            all_notes += [f"{n}: {x}" for x in tree[1]]
            # The base's kernels by short name too: a template parameter added since renames
            # every kernel of the family.
            base_short = {short(k): k for k in base[2]} if base else {}
            for k in sorted(tree[0]):
                if k not in tree[2] or "_kernel" not in k:
                    continue
                print(f"{short(k):<34} {fmt(tree[0][k])}")
                if base:
                    bk = k if k in base[2] else base_short.get(short(k))
                    if bk is not None:
                        same = "identical SASS" if base[2][bk] == tree[2][k] else "SASS differs"
                        print(f"{'  at ' + a.base[:12]:<34} {fmt(base[0][bk])}  {same}")
                    else:
                        print(f"{'  at ' + a.base[:12]:<34} (no such kernel)")
            if base:
                all_notes += [f"{n} at {a.base[:12]}: {x}" for x in base[1]]
        print("ptxas notes:" if all_notes else "ptxas notes: none of C75xx")
        for x in all_notes:
            print("  " + x)
    finally:
        if base_root:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", base_root])
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
