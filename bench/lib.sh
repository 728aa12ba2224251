# Shared by the bench scripts (sourced; needs $PY).
# fio's write bandwidth counts the time to submit and complete its O_DIRECT writes, not the
# final fdatasync (which on a host-cached virtual disk can take as long again): add the
# fdatasync's time, measured right after, so fio's writes are as durable as fastensor's.
durable_bw() { # json-file total-bytes file
    $PY - "$1" "$2" "$3" <<'PYX'
import json, os, sys, time
j = json.load(open(sys.argv[1]))["jobs"][0]["write"]
fd = os.open(sys.argv[3], os.O_RDONLY)
t = time.time(); os.fdatasync(fd); sync_s = time.time() - t
os.close(fd)
print(round(int(sys.argv[2]) / (j["runtime"] / 1e3 + sync_s) / 1e9, 4))
PYX
}
