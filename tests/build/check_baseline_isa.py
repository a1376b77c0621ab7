#!/usr/bin/env python3
"""Checks that a binary of the default build runs on its baseline, x86-64-v3, outside the
dispatched kernels.

Disassembles BINARY (objdump -d) and, function by function, looks for instructions past
x86-64-v3 (AVX2, FMA, BMI2): any EVEX-encoded instruction (AVX-512: the opcode's first byte 0x62
after the legacy prefixes), the AVX-512 mask instructions (VEX-encoded k*), and VEX or legacy
instructions of later extensions (AVX-VNNI, GFNI, VAES, VPCLMULQDQ, AVX-IFMA, AMX, ADX, SHA, ...).
Such instructions may appear only in functions of the namespaces that cohort compiles for
AVX-512 and enters after checking cpuid (`::avx512::`, `::avx512_bf16::` and `::amx::`) and in the AVX-512
clones the loader picks by cpuid (`[clone .arch_x86_64_v4]`); see include/cohort/core/cpu.hpp. Also requires those kernels to be present: every build carries
them.

Usage: check_baseline_isa.py BINARY      exit 0: clean; 1: stray instructions (listed)
"""
import re
import subprocess
import sys

DISPATCHED = re.compile(r"::avx512(_bf16)?::|::amx::|\[clone \.arch_x86_64_v4\]")
LEGACY_PREFIXES = {0x66, 0x67, 0xF2, 0xF3, 0x2E, 0x3E, 0x26, 0x64, 0x65, 0x36}
# Mnemonic prefixes of extensions beyond x86-64-v3 that are not EVEX-encoded.
BEYOND_V3 = ("vpdpbusd", "vpdpwssd",               # AVX-VNNI
             "gf2p8", "vgf2p8",                    # GFNI
             "vaes", "aes",                        # VAES / AES-NI (not in v3)
             "vpclmul", "pclmul",                  # (VP)CLMULQDQ
             "vpmadd52",                           # AVX-IFMA
             "vcvtneps2bf16", "vbcstne", "vcvtnee", "vcvtneo",  # AVX-NE-CONVERT
             "ldtilecfg", "sttilecfg", "tileload", "tilestore", "tilezero", "tdp", "tilerelease",
             "adcx", "adox", "sha1", "sha256", "rdseed", "clflushopt", "clwb", "movdir",
             "kmov", "kand", "kor", "kxor", "kxnor", "knot", "kortest", "ktest", "kshift",
             "kunpck", "kadd")
LINE = re.compile(r"^\s+[0-9a-f]+:\t((?:[0-9a-f]{2} )+)\s*\t(\S+)")
FUNC = re.compile(r"^[0-9a-f]+ <(.+)>:$")


def stray(raw, mnemonic):
    """Why this instruction is past x86-64-v3, or None."""
    bytes_ = [int(b, 16) for b in raw.split()]
    i = 0
    while i < len(bytes_) and bytes_[i] in LEGACY_PREFIXES:
        i += 1
    if i < len(bytes_) and bytes_[i] == 0x62:
        return "EVEX (AVX-512)"
    if mnemonic.startswith(BEYOND_V3):
        return "beyond x86-64-v3"
    return None


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    dis = subprocess.run(["objdump", "-d", "-C", sys.argv[1]], capture_output=True, text=True,
                         check=True).stdout
    func, bad, dispatched = "?", {}, set()
    for line in dis.splitlines():
        m = FUNC.match(line)
        if m:
            func = m.group(1)
            continue
        m = LINE.match(line)
        if not m:
            continue
        why = stray(m.group(1), m.group(2))
        if why is None:
            continue
        if DISPATCHED.search(func):
            dispatched.add(func)
        else:
            bad.setdefault(func, []).append(f"{m.group(2)} ({why})")
    for func, insns in sorted(bad.items()):
        print(f"{func}: {len(insns)} instructions past x86-64-v3, e.g. {', '.join(insns[:3])}")
    print(f"{len(dispatched)} dispatched AVX-512 functions, {len(bad)} others past the baseline")
    if not dispatched:
        print("no dispatched AVX-512 kernel found: the build left them out")
        return 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
