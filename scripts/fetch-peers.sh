#!/usr/bin/env bash
# The peer loaders bench/peers.py compares fastensor with (and torchao and DeepSpeed for
# bench/optim.py),
# fetched at run time (never committed): installed for this machine's venv into .peers/site,
# and as Python 3.12 wheels into .peers/wheels for the GPU machine (scripts/gpu-check.sh
# --peers and --optim install those there).
#   scripts/fetch-peers.sh [--no-wheels]
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
PY=${PY:-.venv/bin/python}
PEERS="fastsafetensors==0.5.0 instanttensor==0.2.2 runai-model-streamer==0.17.1"
# what they need beyond the venv's torch and numpy
NEEDS="humanize==4.17.0 typer==0.29.2"
# the training peers bench/optim.py compares with (GPU machine only: wheels)
TRAIN_PEERS="torchao==0.18.0"
# DeepSpeed is an sdist: built here into a pure-Python wheel (no op compiled ahead: its CPU
# Adam is built where it runs, by torch's JIT with that machine's ninja); the packages it
# needs that the GPU machine lacks come as 3.12 wheels
DEEPSPEED="deepspeed==0.19.8"
DEEPSPEED_NEEDS="hjson==3.1.0 pydantic==2.12.5 pydantic-core==2.41.5 annotated-types==0.7.0
typing-inspection==0.4.2"
mkdir -p .peers
"$PY" -m pip install -q --no-deps --upgrade --target .peers/site $PEERS $NEEDS
if [ "${1:-}" != --no-wheels ]; then
    mkdir -p .peers/wheels
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .peers/wheels $PEERS $TRAIN_PEERS $DEEPSPEED_NEEDS
    if ! ls .peers/wheels/deepspeed-*.whl >/dev/null 2>&1; then
        case $PY in /*) py=$PY ;; */*) py=$here/$PY ;; *) py=$(command -v "$PY") ;; esac
        tmp=$(mktemp -d)
        "$PY" -m pip download -q --no-deps --no-binary=:all: -d "$tmp" "$DEEPSPEED"
        tar -xzf "$tmp"/deepspeed-*.tar.gz -C "$tmp"
        (cd "$tmp"/deepspeed-*/ && DS_BUILD_OPS=0 DS_ACCELERATOR=cuda "$py" -m pip wheel \
            -q --no-deps --no-build-isolation -w "$here/.peers/wheels" .)
        rm -rf "$tmp"
    fi
fi
echo "peers in .peers/site$( [ "${1:-}" = --no-wheels ] || echo " and .peers/wheels")"
