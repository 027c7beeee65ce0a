#!/bin/bash
# The dynamic mode's device measurements (docs/dynamic.md), run from the repository root:
#
#   bash benchmarks/dynamic_device.sh [cuda|cpu] [OUTDIR]
#
# 1. `torchlint confirm --probe-all` on every correct fixture program: it must report nothing;
# 2. one finding confirmed alone in a fresh child, twice (the first run reads torch from a cold
#    disk), with its time split (benchmarks/dynamic_bench.py --single);
# 3. every buggy fixture with every rule selected: the verdicts by rule family (--reach).
# Where libcst or click cannot be imported and .whl/ holds their wheels (the device machine:
# Python 3.12, torch 2.11), they are installed under /tmp/site first.
set -u
DEV=${1:-cuda}
OUT=${2:-${OUT:-/tmp/torchlint-dynamic-out}}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if ! "$PY" -c "import libcst, click" 2>/dev/null; then
    if ls .whl/*.whl >/dev/null 2>&1; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
            || exit 1
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    else
        echo "libcst/click missing and no .whl/ wheels" >&2
        exit 1
    fi
fi
# Run from a checkout that is not installed (the device machine), `torchlint.rules` (the rules/
# folder, mapped by pyproject.toml at install) is not importable: link it for this run only.
if ! "$PY" -c "import torchlint.rules" 2>/dev/null && [ -d rules ] && [ ! -e torchlint/rules ]; then
    ln -s ../rules torchlint/rules && trap 'rm -f torchlint/rules' EXIT
fi
export PYTHONUNBUFFERED=1
"$PY" -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '')"

echo "== 1. confirm --probe-all on fixtures/*/good (--device $DEV)"
t0=$(date +%s)
"$PY" -m torchlint confirm --probe-all --device "$DEV" fixtures/*/good >"$OUT/probe_all_good_$DEV.txt" 2>"$OUT/probe_all_good_$DEV.err"
rc=$?
echo "exit status $rc (0: nothing reported) in $(( $(date +%s) - t0 )) s; findings reported: $(grep -c ' TL[0-9]' "$OUT/probe_all_good_$DEV.txt")"
grep -B1 -A1 "dynamic:" "$OUT/probe_all_good_$DEV.txt" | head -40

echo "== 2. one finding alone, cold child, twice"
"$PY" benchmarks/dynamic_bench.py --single --device "$DEV" --json "$OUT/single1_$DEV.json"
"$PY" benchmarks/dynamic_bench.py --single --device "$DEV" --json "$OUT/single2_$DEV.json"

echo "== 3. every buggy fixture, every rule (--reach)"
"$PY" benchmarks/dynamic_bench.py --reach --device "$DEV" --json "$OUT/reach_$DEV.json"
