#!/usr/bin/python3
"""Writes the seed corpora of fuzz_npy and fuzz_csv (tests/fuzz/corpus/npy, corpus/csv): small
files as numpy.save writes them (every accepted dtype, both header versions, 2 to 4 dimensions)
and CSV files with and without a header, with CRLF and a UTF-8 byte-order mark. Needs numpy.
Deterministic."""
import io
import os

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
npy_dir = os.path.join(here, "corpus", "npy")
csv_dir = os.path.join(here, "corpus", "csv")
os.makedirs(npy_dir, exist_ok=True)
os.makedirs(csv_dir, exist_ok=True)


def save(name, array, version=None):
    buf = io.BytesIO()
    if version is None:
        np.save(buf, array)
    else:
        np.lib.format.write_array(buf, array, version=version)
    with open(os.path.join(npy_dir, name), "wb") as f:
        f.write(buf.getvalue())


save("x_u1_images", np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3))
save("x_f4_tabular", np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4))
save("x_f4_nchw_v2", np.ones((2, 1, 2, 2), dtype=np.float32), version=(2, 0))
for dtype in ("u1", "i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8"):
    save("y_" + dtype.strip("<"), np.array([1, 0], dtype=dtype))
save("y_i8_v2", np.array([0, 1], dtype=np.int64), version=(2, 0))

csvs = {
    "header.csv": "label,a,b,c\n0,0.5,1,2\n1,3,4.25,-5\n",
    "plain.csv": "2,0.00392156886,1e-3,7\n0,1,2,3\n",
    "crlf.csv": "label,x\r\n1,2\r\n0,3",
    # A UTF-8 byte-order mark before samples, and before a header with CRLF line ends.
    "bom.csv": "\ufeff1,0.5,2\n0,1,2\n",
    "bom_crlf_header.csv": "\ufefflabel,a,b\r\n2,1,2\r\n0,3,4\r\n",
    # The header rule: numbers only on line 1 (pandas' unnamed columns) are a sample; a header
    # whose first cell is empty (pandas' index column) is a header.
    "numeric_first_line.csv": "0,1,2\r\n1,0.5,2\r\n",
    "index_header.csv": ",0,1\n1,0.5,2\n",
}
for name, text in csvs.items():
    with open(os.path.join(csv_dir, name), "w", newline="", encoding="utf-8") as f:
        f.write(text)
