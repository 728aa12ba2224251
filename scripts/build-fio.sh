#!/usr/bin/env bash
# Build fio from Debian's source package into $BUILD/extra/fio (default gpubuild/extra/fio)
# for carrying to the GPU machine, which has no fio: only libc, libm and libz are needed at
# run time (Debian 12's glibc 2.36 binaries run on its 2.39). Run as root on the development
# machine; it adds a deb-src entry for Debian's archive for the download and removes it.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-gpubuild}
src=/etc/apt/sources.list.d/fastensor-fio-src.sources
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "$src"' EXIT
cat >"$src" <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
apt-get update -qq
(cd "$tmp" && apt-get source -qq fio >/dev/null 2>&1)
cd "$tmp"/fio-*/
./configure --disable-native --disable-numa --disable-rdma --disable-rados --disable-rbd \
    --disable-http --disable-gfapi --disable-pmem --disable-dfs --disable-xnvme >/dev/null
make -j"$(nproc)" fio >/dev/null
install -D -m 755 fio "$here/$BUILD/extra/fio"
echo "built $here/$BUILD/extra/fio ($("$here/$BUILD/extra/fio" --version)); needs: $(ldd fio | awk '/=>/{print $1}' | tr '\n' ' ')"
