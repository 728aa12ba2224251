#!/usr/bin/env bash
# Build the Python extension in place and run the Python tests with the project venv's
# interpreter (made by `make venv`), or $FT_PYTHON.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
PY=${FT_PYTHON:-$root/.venv/bin/python}
FT_REMAKE=0 $PY setup.py -q build_ext --inplace --force >/dev/null
export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
set +e
$PY -m pytest -q -rs "$root/tests/python" "$@"
rc=$?
[ $rc = 5 ] && { echo "pytest collected no tests"; rc=1; }
exit $rc
