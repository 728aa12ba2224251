#!/usr/bin/env bash
# Install what fastensor needs on Debian/Ubuntu when missing. As root it runs apt-get;
# otherwise it prints the exact command to run and fails.
set -eu
# Build: compiler, make, pkg-config, liburing (io_uring), xxhash (checksums).
# Tests and benchmarks: fio; fuzz targets: clang; Python package and its tests:
# python3-dev and python3-venv (the packages themselves go into the project venv, `make venv`).
pkgs_needed=()
need_header() { [ -f "/usr/include/$1" ] || pkgs_needed+=("$2"); }
need_cmd() { command -v "$1" >/dev/null 2>&1 || pkgs_needed+=("$2"); }
need_cmd cc gcc
need_cmd make make
need_cmd pkg-config pkg-config
need_header liburing.h liburing-dev
need_header xxhash.h libxxhash-dev
need_cmd fio fio
need_cmd clang clang
[ -n "$(ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a 2>/dev/null)" ] || pkgs_needed+=(libclang-rt-14-dev)
if [ "${FT_DEPS_PYTHON:-1}" = 1 ]; then
    py=/usr/bin/python3
    [ -x $py ] || pkgs_needed+=(python3)
    [ -x $py ] && ! $py -c 'import sysconfig,os,sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"],"Python.h")))' 2>/dev/null && pkgs_needed+=(python3-dev)
    [ -x $py ] && ! $py -c 'import ensurepip, venv' 2>/dev/null && pkgs_needed+=(python3-venv)
fi
[ ${#pkgs_needed[@]} -eq 0 ] && exit 0
cmd="apt-get install -y --no-install-recommends ${pkgs_needed[*]}"
if [ "$(id -u)" != 0 ]; then
    echo "fastensor needs: ${pkgs_needed[*]}" >&2
    echo "run as root:  apt-get update && $cmd" >&2
    exit 1
fi
echo "installing: ${pkgs_needed[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
$cmd
