#!/usr/bin/env bash
# The digest test of `--data` formats (a ctest case): converts the IDX fixture to .npy (uint8
# and float32 X) and to CSV with convert_dataset.py, trains 20 steps on each and on the IDX
# files, and requires the same weights_digest from all; the fixture as PNG class folders must
# give the digest of the same images as .npy files in the folders' order (label, then index); a control with the first image's non-zero
# pixels moved by one ulp must give a different digest (so the comparison can fail). Also: an mlp
# whose IN or OUT does not match CSV data is refused naming both numbers.
#   check_data_formats.sh COHORT_BINARY FIXTURE_DIR
set -euo pipefail
cohort=$1
fixture=$2
here=$(cd "$(dirname "$0")" && pwd)
# Debian's python3-numpy is for Debian's python3; a python3 earlier on PATH may lack numpy.
python=
for p in /usr/bin/python3 python3; do
  if "$p" -c "import numpy" 2>/dev/null; then python=$p; break; fi
done
if [[ -z "$python" ]]; then
  echo "check_data_formats: no python3 with numpy (install python3-numpy: scripts/setup.sh test)" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

digest() {  # digest NAME DATA_DIR
  "$cohort" train --data "$2" --steps 20 --batch 64 --model mlp:784-32-10 \
    --summary "$work/$1.json" > "$work/$1.log" 2>&1 || { cat "$work/$1.log" >&2; exit 1; }
  "$python" -c "import json,sys; print(json.load(open(sys.argv[1]))['weights_digest'])" \
    "$work/$1.json"
}

want=$(digest idx "$fixture")
echo "idx          $want"
status=0
for format in npy-uint8 npy-float32 csv; do
  "$python" "$here/convert_dataset.py" "$fixture" "$work/$format" --format "$format"
  got=$(digest "$format" "$work/$format")
  echo "$format $(printf '%*s' $((12 - ${#format})) '')$got"
  if [[ "$got" != "$want" ]]; then
    echo "check_data_formats: $format gave $got, IDX gave $want" >&2
    status=1
  fi
done
# Image folders: read in class-folder, then file-name order, so compared with .npy files in that
# order (the IDX order shuffles to other batches).
"$python" "$here/convert_dataset.py" "$fixture" "$work/png" --format png-folders
"$python" "$here/convert_dataset.py" "$fixture" "$work/by-class" --format npy-uint8 --class-order
want_png=$(digest by-class "$work/by-class")
got=$(digest png "$work/png")
echo "png-folders  $got (npy-uint8 in class order: $want_png)"
if [[ "$got" != "$want_png" ]]; then
  echo "check_data_formats: png-folders gave $got, the same images as .npy gave $want_png" >&2
  status=1
fi
if [[ "$want_png" == "$want" ]]; then
  echo "check_data_formats: class order gave IDX order's digest: the order is not tested" >&2
  status=1
fi
"$python" "$here/convert_dataset.py" "$fixture" "$work/nudged" --format npy-float32 --nudge
got=$(digest nudged "$work/nudged")
echo "nudged       $got (must differ)"
if [[ "$got" == "$want" ]]; then
  echo "check_data_formats: one-ulp changes of one image's pixels left the digest unchanged" >&2
  status=1
fi
# --model against tabular data: refused before training, naming both numbers.
refused() {  # refused MODEL PHRASE
  if "$cohort" train --data "$work/csv" --model "$1" --steps 1 --dry-run > "$work/refused.log" 2>&1
  then
    echo "check_data_formats: --model $1 on CSV data was accepted" >&2
    status=1
  elif ! grep -qF -- "$2" "$work/refused.log"; then
    echo "check_data_formats: --model $1: expected '$2' in: $(cat "$work/refused.log")" >&2
    status=1
  fi
}
refused mlp:100-10 "--model: expected an input size of 784 (784 tabular features), found 100"
refused mlp:784-32-9 "--model: expected an output size of 10 (classes), found 9"
exit $status
