#!/usr/bin/env bash
# `fastensor tune` builds a profile with every kind of key it promises, the cold streams read
# with calls in flight among them, and `fastensor profile show` prints it; a corrupt profile
# is reported and rebuilt.
set -eu
BUILD=${BUILD:-build}
dir=${FT_TEST_DIR:-/tmp}/check-tune.$$
mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT
export FASTENSOR_PROFILE="$dir/profile.txt"
unset FASTENSOR_QUIET # the warning for a corrupt profile is checked
"$BUILD/fastensor" tune --file "$dir/tune.tmp" --seconds 60 --max-size 16M >"$dir/tune.out" 2>&1 ||
    { cat "$dir/tune.out"; echo "tune failed"; exit 1; }
"$BUILD/fastensor" profile show --file "$dir" >"$dir/show.out" 2>&1 ||
    { cat "$dir/show.out"; echo "profile show failed"; exit 1; }
bad=0
# op mem size class busy: the keys tune must have measured (an arm at least)
for want in "read host 4K cached no" "read host 64K stream no" \
            "read host 64K stream yes" "read host 1M stream yes" "read host 4M stream yes" \
            "write host 1M sync no" "write host 1M later no"; do
    set -- $want
    awk -v op="$1" -v mem="$2" -v size="$3" -v cache="$4" -v busy="$5" \
        '$1 == op && $2 == mem && $3 == size && $4 == cache && $5 == busy && NF >= 7 {found = 1}
         END {exit !found}' "$dir/show.out" || { echo "no key '$want' in the profile"; bad=1; }
done
# a 16 MiB file holds one 16 MiB call: no stream of them can have two in flight
if awk '$3 == "16M" && $4 == "stream" && $5 == "yes"' "$dir/show.out" | grep -q .; then
    echo "a busy 16M stream key from a 16 MiB file"; bad=1
fi
[ $bad = 0 ] || { cat "$dir/show.out"; exit 1; }
printf 'garbage\n' >"$FASTENSOR_PROFILE"
"$BUILD/fastensor" tune --file "$dir/tune.tmp" --seconds 2 --max-size 64K >/dev/null 2>"$dir/err" ||
    { cat "$dir/err"; echo "tune failed on a corrupt profile"; exit 1; }
grep -q "ignoring profile" "$dir/err" ||
    { cat "$dir/err"; echo "no warning for a corrupt profile"; exit 1; }
head -1 "$FASTENSOR_PROFILE" | grep -q '^fastensor-profile ' ||
    { echo "the corrupt profile was not rebuilt"; exit 1; }
# the CLI's cache mode: every command's contexts take it; a bad one is a usage error
"$BUILD/fastensor" --cache bypass info --path "$dir" | grep -q "cache=bypass" ||
    { echo "fastensor --cache bypass info does not show cache=bypass"; exit 1; }
rc=0; "$BUILD/fastensor" --cache sometimes info >/dev/null 2>&1 || rc=$?
[ $rc = 2 ] || { echo "fastensor --cache sometimes: exit $rc, not 2"; exit 1; }
echo "ok: tune measured every kind of key, profile show printed them, a corrupt profile was rebuilt"
