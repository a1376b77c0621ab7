#!/usr/bin/python3
"""Runs svg_samples (the path is the only argument) into a temporary folder and parses every SVG
it writes with xml.etree.ElementTree: each must be well-formed XML whose root is an SVG element
with a loss panel, an accuracy panel and a legend. Exits non-zero on the first failure."""
import pathlib, subprocess, sys, tempfile
import xml.etree.ElementTree as ET

SVG = "{http://www.w3.org/2000/svg}"
EXPECTED = {"several_runs.svg", "one_point.svg", "constant.svg", "steps_only.svg",
            "epochs_only.svg", "no_series.svg"}

with tempfile.TemporaryDirectory() as folder:
    subprocess.run([sys.argv[1], folder], check=True)
    written = {p.name for p in pathlib.Path(folder).glob("*.svg")}
    if written != EXPECTED:
        sys.exit(f"expected the samples {sorted(EXPECTED)}, found {sorted(written)}")
    for name in sorted(written):
        root = ET.parse(pathlib.Path(folder) / name).getroot()  # raises on malformed XML
        if root.tag != SVG + "svg":
            sys.exit(f"{name}: expected an <svg> root in the SVG namespace, found {root.tag}")
        groups = {g.get("id") or g.get("class") for g in root.iter(SVG + "g")}
        if not {"loss-panel", "accuracy-panel", "legend"} <= groups:
            sys.exit(f"{name}: expected loss-panel, accuracy-panel and legend groups, found {groups}")
        print(f"{name}: well-formed, {sum(1 for _ in root.iter())} elements")
