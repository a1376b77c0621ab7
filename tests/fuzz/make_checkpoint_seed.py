#!/usr/bin/python3
"""Writes the checkpoint fuzzer's seed: a small valid checkpoint in cohort's format (see
src/checkpoint/checkpoint.cpp), so the fuzzer starts past the magic and the checksums."""
import struct, sys, zlib
meta = b"model=mlp:2-2\nstep=3\nseed=1\nbatch=4\nmicro_batch=2\ntrain_count=8\ndrop_last=1\nconfig={}\n"
parm = struct.pack("<8f", *[0.5 * i for i in range(8)])
momn = struct.pack("<8f", *[0.1 * i for i in range(8)])
out = b"COHORTCK" + struct.pack("<II", 1, 3)
for tag, payload in ((b"META", meta), (b"PARM", parm), (b"MOMN", momn)):
    out += tag + struct.pack("<Q", len(payload)) + payload + struct.pack("<I", zlib.crc32(payload))
open(sys.argv[1], "wb").write(out)
