#!/usr/bin/python3
"""Writes a checkpoint fuzzer seed: a small valid checkpoint in cohort's current format (version 2,
see src/checkpoint/checkpoint.cpp) with two optimizer state arrays, so the fuzzer starts past the
magic and the checksums. corpus/checkpoint/small_v1 is a version 1 file, kept as written then."""
import struct, sys, zlib
meta = (b"model=mlp:2-2\nstep=3\nupdates=2\nskipped=1\nseed=1\nbatch=4\nmicro_batch=2\n"
        b"train_count=8\ndrop_last=1\noptimizer=adam\nconfig={}\n")
parm = struct.pack("<8f", *[0.5 * i for i in range(8)])
st00 = struct.pack("<8f", *[0.1 * i for i in range(8)])
st01 = struct.pack("<8f", *[0.2 * i for i in range(8)])
out = b"COHORTCK" + struct.pack("<II", 2, 4)
for tag, payload in ((b"META", meta), (b"PARM", parm), (b"ST00", st00), (b"ST01", st01)):
    out += tag + struct.pack("<Q", len(payload)) + payload + struct.pack("<I", zlib.crc32(payload))
open(sys.argv[1], "wb").write(out)
