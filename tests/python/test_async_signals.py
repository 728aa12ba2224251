"""Async saves are never lost in silence: SIGTERM right after save_file_async returns
finishes the save before the signal is honoured (the handler that was there before runs,
the default one ends the process by SIGTERM), and a failed save whose result no one checks
is reported at exit with status 1."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import st_reader  # noqa: E402  (an independent reader: the parent must not start fastensor)

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")


def run(code, env=None, timeout=300):
    e = dict(os.environ, PYTHONPATH=PYDIR + os.pathsep + HERE)
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e,
                          capture_output=True, text=True, timeout=timeout)


def version(i, n=1 << 20):
    g = torch.Generator().manual_seed(1000 + i)
    return {"w": torch.randn(n, generator=g), "b": torch.randint(0, 9, (4097,), generator=g)}


# Forked children each save version i and send themselves SIGTERM at once; the parent
# checks how each ended and what the name holds, with st_reader (fastensor is never started
# in the parent, so every child starts it afresh).
TRIALS = """
import os, signal, sys, torch
sys.path.insert(0, {here!r})
import st_reader
from test_async_signals import version
path, trials = {path!r}, {trials}
bad = []
for i in range(trials):
    pid = os.fork()
    if pid == 0:
        import fastensor.torch as ft
        ft.save_file_async(version(i), path)
        os.kill(os.getpid(), signal.SIGTERM)
        import time; time.sleep(60)
        os._exit(99)  # the signal was not honoured
    _, status = os.waitpid(pid, 0)
    if not os.WIFSIGNALED(status) or os.WTERMSIG(status) != signal.SIGTERM:
        bad.append((i, "ended with status %d" % status))
        continue
    _, _, got = st_reader.read(path)
    want = version(i)
    for k, t in want.items():
        if got[k][2] != t.numpy().tobytes():
            bad.append((i, "tensor %s is not version %d's" % (k, i)))
    left = [n for n in os.listdir(os.path.dirname(path)) if n != os.path.basename(path)]
    if left:
        bad.append((i, "left %s" % left))
print("trials", trials, "bad", len(bad), bad[:5])
"""


def test_sigterm_right_after_an_async_save_leaves_the_new_checkpoint(tmp):
    path = os.path.join(tmp, "m.safetensors")
    r = run(TRIALS.format(here=HERE, path=path, trials=100), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "trials 100 bad 0 []" in r.stdout, r.stdout + r.stderr[-3000:]
    assert "finishing 1 checkpoint save(s) in flight" in r.stderr


def test_sigterm_honours_the_handler_that_was_there(tmp):
    path = os.path.join(tmp, "m.safetensors")
    r = run(f"""
        import os, signal, sys, time
        import fastensor.torch as ft
        from test_async_signals import version
        def mine(signum, frame):
            print("mine", signum, flush=True)
            sys.exit(7)
        signal.signal(signal.SIGTERM, mine)
        ft.save_file_async(version(3), {path!r})
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)
    """)
    assert r.returncode == 7 and "mine 15" in r.stdout, r.stderr[-2000:]
    _, _, got = st_reader.read(path)
    assert got["w"][2] == version(3)["w"].numpy().tobytes()


def test_sigterm_after_the_saves_ended_is_the_previous_handlers(tmp):
    path = os.path.join(tmp, "m.safetensors")
    r = run(f"""
        import os, signal, time
        import fastensor.torch as ft
        ft.save_file_async({{"a": ft.torch.zeros(10)}}, {path!r}).result()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)
    """)
    assert r.returncode == -signal.SIGTERM and "finishing" not in r.stderr, r.stderr[-2000:]


def test_sigterm_left_alone_on_request(tmp):
    r = run(f"""
        import signal
        import fastensor.torch as ft
        ft.save_file_async({{"a": ft.torch.zeros(10)}}, {os.path.join(tmp, "m.safetensors")!r})
        print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
    """, env={"FASTENSOR_SIGTERM": "default"})
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr[-2000:]


UNCHECKED = """
import time
import fastensor.torch as ft
f = ft.save_file_async({"a": ft.torch.zeros(10)}, "/proc/none/m.safetensors")
while not f.done():
    time.sleep(0.01)
"""


def test_an_unchecked_failed_save_is_reported_at_exit():
    r = run(UNCHECKED)
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert "the checkpoint save to /proc/none/m.safetensors failed, and its result was " \
           "never checked" in r.stderr
    r = run(UNCHECKED, env={"FASTENSOR_UNCHECKED_SAVE": "warn"})
    assert r.returncode == 0 and "never checked" in r.stderr


@pytest.mark.parametrize("look", ["result", "exception", "callback"])
def test_a_failed_save_whose_result_was_looked_at_is_the_callers(look):
    ask = {"result": "try:\n    f.result()\nexcept OSError:\n    pass",
           "exception": "assert f.exception() is not None",
           "callback": "f.add_done_callback(lambda f: None)"}[look]
    r = run(UNCHECKED + ask + "\n")
    assert r.returncode == 0 and "never checked" not in r.stderr, r.stderr[-2000:]
