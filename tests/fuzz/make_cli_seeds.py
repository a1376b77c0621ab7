#!/usr/bin/python3
"""Writes the CLI fuzzer's seeds (corpus/cli/) from README.md: one file per `cohort train`
example, its arguments one per line; for an example with --config, a NUL byte and the config
file's text follow (the fuzzer serves that text for the path). Run from anywhere:
python3 tests/fuzz/make_cli_seeds.py"""
import pathlib, re, shlex

root = pathlib.Path(__file__).resolve().parents[2]
out = root / "tests/fuzz/corpus/cli"
out.mkdir(parents=True, exist_ok=True)
for old in out.glob("readme_*"):
    old.unlink()
examples = re.findall(r"^build/release/cohort train (.*)$", (root / "README.md").read_text(), re.M)
for n, line in enumerate(examples, 1):
    args = shlex.split(line, comments=True)
    seed = "\n".join(args).encode()
    if "--config" in args:
        seed += b"\0" + (root / args[args.index("--config") + 1]).read_bytes()
    name = "readme_" + "_".join(a[2:] for a in args if a.startswith("--"))[:80]
    if (out / name).exists():  # two examples with the same flags
        name += f"_{n}"
    (out / name).write_bytes(seed)
    print(out / name)
