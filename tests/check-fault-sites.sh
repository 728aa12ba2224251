#!/usr/bin/env bash
# Every call site of the syscall table (each `ft__sys.NAME(` line in src/) must have had a
# fault injected by some test of this run: the test binaries append the sites they injected
# at to $FT_FAULT_SITES (return addresses as offsets in the binary, see tests/testfault.c),
# which this maps to source lines with addr2line. A site listed below is excused, with why.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
sites=${FT_FAULT_SITES:-}
if [ -z "$sites" ] || [ ! -s "$sites" ]; then
    echo "SKIP: no injected sites recorded (run through tests/run.sh, which sets FT_FAULT_SITES)"
    exit 77
fi
case ${SAN:-} in *thread*)
    echo "SKIP: under ThreadSanitizer the fork-based cases do not run (the plain and ASan runs check the sites)"
    exit 77 ;;
esac
command -v addr2line >/dev/null || { echo "SKIP: addr2line (binutils) is not installed"; exit 77; }

# Sites that cannot fail in a way the library could see: void calls, and closedir (nothing
# to act on, its result is not read).
excused='uring_exit rewinddir closedir'
# A site no test here can reach carries the comment "/* no fault test: WHY */" on its line
# (listed as excused, with the reason).

injected=$(mktemp)
trap 'rm -f "$injected"' EXIT
awk '$1 == "injected" { print $2, $3 }' "$sites" | sort -u | while read -r bin off; do
    echo "$bin $off"
done | awk '{ a[$1] = a[$1] " " $2 } END { for (b in a) print b a[b] }' |
while read -r bin offs; do
    # -i: the innermost (inlined) frame comes first after each address
    # shellcheck disable=SC2086
    addr2line -a -i -e "$bin" $offs | awk '/^0x/ { take = 1; next } take { print; take = 0 }'
done | sed -E 's|.*/(src/)|\1|; s| \(discriminator [0-9]+\)||' | sort -u >"$injected"

total=0 missing=0
while IFS= read -r site; do
    file=${site%%:*}
    rest=${site#*:}
    line=${rest%%:*}
    call=$(printf '%s' "$rest" | grep -oE 'ft__sys\.[a-z_]+' | head -1)
    call=${call#ft__sys.}
    case " $excused " in *" $call "*) continue ;; esac
    why=$(printf '%s' "$rest" | sed -nE 's|.*/\* no fault test: (.*) \*/.*|\1|p')
    [ -n "$why" ] && { echo "excused: $file:$line ($call): $why"; continue; }
    total=$((total + 1))
    if ! grep -qx "$file:$line" "$injected"; then
        missing=$((missing + 1))
        echo "never injected: $file:$line ($call)"
    fi
done < <(cd "$root" && grep -rnE 'ft__sys\.[a-z_]+\(' src | grep -v 'ft__sys\.uring_exit')

echo "$((total - missing)) of $total syscall-table call sites had a fault injected"
[ "$missing" -eq 0 ]
