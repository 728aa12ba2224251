# Sourced by tests/check-layers.sh and tests/check-calls.sh: what a check found against the
# list of known violations that only shrinks.
#   against_known FOUND KNOWN WHAT LABEL
# FOUND: the violations, a line each; KNOWN: the list file (# comments); WHAT: how to name
# new ones; LABEL: the word of the pass line. Prints new ones and listed ones no longer
# found (both fail: the list only shrinks). @return 0 or 1.
against_known() {
    local found=$1 known=$2 what=$3 label=$4 listed new gone rc=0
    listed=$(grep -v '^#' "$known" | sed '/^$/d' | sort -u)
    found=$(printf '%s\n' "$found" | sed '/^$/d' | sort -u)
    new=$(comm -23 <(printf '%s\n' "$found") <(printf '%s\n' "$listed") | sed '/^$/d')
    gone=$(comm -13 <(printf '%s\n' "$found") <(printf '%s\n' "$listed") | sed '/^$/d')
    if [ -n "$new" ]; then
        echo "$what:"
        printf '%s\n' "$new" | sed 's/^/  /'
        rc=1
    fi
    if [ -n "$gone" ]; then
        echo "listed in $(basename "$known") but no longer there (take them off the list):"
        printf '%s\n' "$gone" | sed 's/^/  /'
        rc=1
    fi
    [ $rc = 0 ] && echo "$label: no new violation ($(printf '%s' "$listed" | grep -c .) known" \
        "ones left, $(basename "$known"))"
    return $rc
}
