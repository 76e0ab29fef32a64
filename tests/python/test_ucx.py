"""Processes as ranks without mpirun: reshard.Comm.ucx over plain
subprocesses that meet at a rendezvous address. Skipped where reshard was
built without UCX, unless RESHARD_REQUIRE_UCX=1 (the test command sets it
where libucx-dev is installed: there it must run)."""
import os
import subprocess
import sys
import time

import pytest

import reshard
from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
from free_port import free_port  # noqa: E402

if not reshard.HAVE_UCX and os.environ.get("RESHARD_REQUIRE_UCX") == "1":
    raise RuntimeError("RESHARD_REQUIRE_UCX=1 but this reshard has no UCX transport")
pytestmark = pytest.mark.skipif(not reshard.HAVE_UCX, reason="needs a reshard built with UCX")


def launch(size, script, *args, timeout=240):
    """Starts `size` processes of `script` (rank 0 last, so that the others
    wait for its listener) and waits for all within `timeout`: a hang
    kills every process and fails. Returns [(rc, output)] by rank."""
    rendezvous = "127.0.0.1:%d" % free_port()
    env = dict(os.environ, RESHARD_TIMEOUT_MS="30000")
    procs = {}
    for rank in reversed(range(size)):
        procs[rank] = subprocess.Popen(
            [sys.executable, script, rendezvous, str(rank), str(size)] + [str(a) for a in args],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    until = time.monotonic() + timeout
    out = {}
    try:
        for rank, p in procs.items():
            out[rank] = (p.wait(timeout=max(1, until - time.monotonic())), p.stdout.read())
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return [out[r] for r in sorted(out)]


@pytest.mark.parametrize("register", [False, True])
def test_random_layouts_ucx(seed, register):
    """Random layouts over 4 processes; registered: each plan's numpy
    buffers registered (plan.register_buffers), so every execute reads its
    boxes one-sided from the senders' arrays."""
    res = launch(4, "tests/python/ucx_random_layouts.py", seed, 8, *(["register"] if register else []))
    for rank, (rc, text) in enumerate(res):
        assert rc == 0 and "OK" in text, "rank %d:\n%s" % (rank, text)


def test_rendezvous_times_out_when_a_rank_is_missing():
    """Size 3, ranks 0 and 1 only: both raise TimeoutError within their
    deadline (2 s) naming what did not arrive; nothing hangs."""
    script = ("import sys, time, reshard\n"
              "t0 = time.monotonic()\n"
              "try:\n"
              "    reshard.Comm.ucx(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), timeout_ms=2000)\n"
              "except reshard.TimeoutError as e:\n"
              "    print('TIMEOUT after %.1f s: %s' % (time.monotonic() - t0, e))\n")
    rendezvous = "127.0.0.1:%d" % free_port()
    procs = [subprocess.Popen([sys.executable, "-c", script, rendezvous, str(r), "3"], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in (1, 0)]
    try:
        outs = [p.communicate(timeout=60)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for text in outs:
        assert "TIMEOUT after" in text, text
        took = float(text.split("TIMEOUT after ")[1].split(" s")[0])
        assert took < 4, text
    assert "2 of 3 ranks arrived" in outs[1]


def test_bad_rendezvous_is_invalid_argument():
    with pytest.raises(reshard.InvalidArgumentError, match="host:port"):
        reshard.Comm.ucx("no-port-here", 0, 2, timeout_ms=1000)
    with pytest.raises(reshard.InvalidArgumentError, match="rank 2 of size 2"):
        reshard.Comm.ucx("127.0.0.1:1", 2, 2, timeout_ms=1000)


def test_commit_in_doubt_settles_over_ucx():
    """The commit in doubt over UCX (tests/python/in_doubt.py, the script
    test_mpi.py runs under mpirun): the last of three ranks is 1.5 s late to
    version 2's commit, the others raise InDoubtError and settle it with
    plan.resolve(), as python/README.md advises; every rank ends at version
    3 in the same copy, every element checked in the script."""
    res = launch(3, "tests/python/in_doubt.py", timeout=120)
    ends = set()
    for rank, (rc, text) in enumerate(res):
        assert rc == 0 and ": OK: in doubt then settled" in text, "rank %d:\n%s" % (rank, text)
        ends.add(text.split("every rank at version 3 in copy ")[1].split()[0])
    assert len(ends) == 1, res


@pytest.mark.parametrize("size", [4, 6])
@pytest.mark.parametrize("mode", ["recreate", "keep"])
def test_replica_killed_and_replaced(mode, size):
    """A replica SIGKILLed between two versions and new processes in its
    slots (tests/python/ucx_rejoin.py): size 4, rank 3 (half of the one
    tensor-parallel pair); size 6, ranks 4 and 5 (the second of two
    replicas of two ranks). The staying ranks' execute fails in time with
    the last version whole, they call comm.rejoin (a list for two), the
    newcomers Comm.ucx(..., joining=True), and the next version arrives
    whole on every destination rank. No rank restarts but the replaced
    ones. mode keep: the staying ranks keep their plans (plan.rejoin()), a
    newcomer of other layouts refused first on every rank, and a
    registered plan is registered again after the rejoin: each staying
    rank keeps its registration and trades keys with the newcomers among
    its partners alone (its RESHARD_DEBUG=INFO line says how many), each
    newcomer with all of its partners."""
    victims = [3] if size == 4 else [4, 5]
    rendezvous = "127.0.0.1:%d" % free_port()
    script = "tests/python/ucx_rejoin.py"
    env = dict(os.environ)
    env.pop("RESHARD_TIMEOUT_MS", None)  # (it would override the plan's 1 s)
    if mode == "keep":
        env.update(RESHARD_DEBUG="INFO", RESHARD_DEBUG_SUBSYS="EXEC")

    def start(rank, role):
        return subprocess.Popen([sys.executable, script, rendezvous, str(rank), str(size), role, mode], cwd=ROOT,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    procs = {r: start(r, "member") for r in reversed(range(size))}
    newcomers = {}
    try:
        for v in victims:
            seen = []
            for line in procs[v].stdout:  # (each script's lines are flushed)
                seen.append(line)
                if line.startswith("RANK%d AT 2" % v):
                    break
            assert seen and seen[-1].startswith("RANK%d AT 2" % v), "".join(seen)
        for v in victims:
            procs[v].kill()  # SIGKILL
            procs[v].wait(timeout=10)
        newcomers = {v: start(v, "newcomer") for v in victims}
        staying = [r for r in range(size) if r not in victims]
        outs = {r: procs[r].communicate(timeout=90)[0] for r in staying}
        outs.update({v: newcomers[v].communicate(timeout=90)[0] for v in victims})
    finally:
        for p in list(procs.values()) + list(newcomers.values()):
            if p.poll() is None:
                p.kill()
                p.wait()
    for r in staying:
        assert procs[r].returncode == 0 and "OK rank %d (staying)" % r in outs[r], "rank %d:\n%s" % (r, outs[r])
        assert "version 3 failed after" in outs[r], outs[r]
        if mode == "keep":  # a source's partners: every destination rank; a destination's: the two sources
            want = "kept over the rejoin: keys traded with %d of %d partners" % (
                (len(victims), size - 2) if r < 2 else (0, 2))
            assert want in outs[r], "rank %d: no '%s':\n%s" % (r, want, outs[r])
    for v in victims:
        assert newcomers[v].returncode == 0 and "OK rank %d (newcomer)" % v in outs[v], outs[v]
        if mode == "keep":
            assert "anew: keys traded with 2 of 2 partners" in outs[v], outs[v]
    print("".join(outs[r] for r in range(size)))


def test_replica_rejoin_retried_when_a_newcomer_is_missing():
    """A replica of two ranks (4 and 5 of 6) killed, and only rank 4's
    newcomer started (tests/python/ucx_rejoin.py, "retry"): the staying
    ranks' comm.rejoin([4, 5], timeout_ms=1500) raises TimeoutError saying
    nothing changed, and rank 0 tells the newcomer that came (its Comm.ucx
    raises TimeoutError at once: rank 0 gave up) instead of leaving it to
    its own 30 s deadline. Both newcomers started again, the second call
    meets them and the next version arrives whole on every destination
    rank."""
    size, victims = 6, [4, 5]
    rendezvous = "127.0.0.1:%d" % free_port()
    script = "tests/python/ucx_rejoin.py"
    env = dict(os.environ)
    env.pop("RESHARD_TIMEOUT_MS", None)

    def start(rank, role):
        return subprocess.Popen([sys.executable, script, rendezvous, str(rank), str(size), role, "retry"], cwd=ROOT,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    procs = {r: start(r, "member") for r in reversed(range(size))}
    late = {}
    early = None
    try:
        for v in victims:
            for line in procs[v].stdout:
                if line.startswith("RANK%d AT 2" % v):
                    break
        for v in victims:
            procs[v].kill()
            procs[v].wait(timeout=10)
        t0 = time.monotonic()
        early = start(4, "early")
        early_out = early.communicate(timeout=60)[0]
        early_s = time.monotonic() - t0
        late = {v: start(v, "newcomer") for v in victims}
        staying = [r for r in range(size) if r not in victims]
        outs = {r: procs[r].communicate(timeout=90)[0] for r in staying}
        outs.update({v: late[v].communicate(timeout=90)[0] for v in victims})
    finally:
        for p in list(procs.values()) + list(late.values()) + [early]:
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert early.returncode == 0 and "EARLY NEWCOMER GAVE UP" in early_out, early_out
    # (the staying ranks' failed execute, up to 2 x 1 s, then the 1.5 s rejoin)
    assert early_s < 10, "the early newcomer gave up only after %.1f s:\n%s" % (early_s, early_out)
    for r in staying:
        assert procs[r].returncode == 0 and "OK rank %d (staying)" % r in outs[r], "rank %d:\n%s" % (r, outs[r])
        assert "timed out after" in outs[r] and "nothing changed" in outs[r], outs[r]
    for v in victims:
        assert late[v].returncode == 0 and "OK rank %d (newcomer)" % v in outs[v], outs[v]
    print(early_out + "".join(outs[r] for r in range(size)))


def test_replicas_join_and_leave_by_resize():
    """An inference fleet that grows and shrinks (tests/python/ucx_resize.py):
    a job of 2 trainers and one replica of two ranks moves version 1; a
    second replica joins (Comm.ucx(joining=True) as ranks 4 and 5 of 6,
    started at once, while the others call comm.resize(join=2)); version 2
    over the new plan, the old plan refused with its arrays untouched; then
    the first replica's processes SIGKILL themselves and the others call
    comm.resize(leave=[2, 3]): the second replica's processes are ranks 2
    and 3 of 4, version 3 over the new plan. Every destination element of
    every version checked on every destination rank."""
    rendezvous = "127.0.0.1:%d" % free_port()
    script = "tests/python/ucx_resize.py"
    env = dict(os.environ)
    env.pop("RESHARD_TIMEOUT_MS", None)
    procs = {}
    try:
        for p in (3, 2, 1, 0):
            procs[p] = subprocess.Popen([sys.executable, script, rendezvous, str(p), "first"], cwd=ROOT, env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for p in (4, 5):
            procs[p] = subprocess.Popen([sys.executable, script, rendezvous, str(p), "second"], cwd=ROOT, env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        outs = {p: procs[p].communicate(timeout=120)[0] for p in sorted(procs)}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    for p in (2, 3):
        assert procs[p].returncode == -9 and "PROCESS %d DIES" % p in outs[p], outs[p]
    for p in (0, 1, 4, 5):
        assert procs[p].returncode == 0 and "OK process %d" % p in outs[p], "process %d:\n%s" % (p, outs[p])
    print("".join(outs[p] for p in sorted(outs)))


def test_resize_refusals():
    """Comm.resize's refusals need no peer: InvalidArgumentError naming
    what is wrong (a one-rank UCX communicator: nothing to change, as many
    leaving as the communicator, a negative count, a timeout below 1 ms),
    nothing changed; and a communicator of another kind."""
    comm = reshard.Comm.ucx("127.0.0.1:%d" % free_port(), 0, 1, timeout_ms=10000)
    try:
        # (one rank: any leaving rank is as many as the communicator; the
        # C test test_ucx_resize_steps refuses rank 0, this rank, out of
        # range and twice on a communicator of 5)
        for kw, says in ((dict(), "nothing to change"), (dict(leave=[0]), "1 ranks leaving, of size 1"),
                         (dict(join=-1), "a negative count"), (dict(leave=[0], join=-2), "a negative count")):
            with pytest.raises(reshard.InvalidArgumentError, match=says):
                comm.resize(**kw)
        assert (comm.rank, comm.size) == (0, 1)
        with pytest.raises(reshard.InvalidArgumentError, match="timeout_ms"):
            comm.resize(join=1, timeout_ms=0)
    finally:
        comm.close()
    world = reshard.InprocWorld(1)
    c = world.comm(0)
    try:
        with pytest.raises(reshard.InvalidArgumentError, match="only UCX"):
            c.resize(join=1)
    finally:
        c.close()
        world.close()


def test_ucx_cuda_without_a_gpu():
    """GPU memory over UCX (Comm.ucx_cuda) on a machine without a GPU
    driver (this one): BackendError naming the CUDA error
    (UnsupportedError from a build without CUDA), nothing left behind,
    and the UCX communicator under it stays usable. (Its transfers run on
    the emulated device in the C test test_gpu_ucx_cuda, through Debian's
    UCX as it is and with the device memory moved by UCX, and on a GPU in
    scripts/gpu_check.sh.) A host of another kind is InvalidArgumentError."""
    host = reshard.Comm.ucx("127.0.0.1:%d" % free_port(), 0, 1, timeout_ms=10000)
    try:
        with pytest.raises((reshard.BackendError, reshard.UnsupportedError), match="CUDA"):
            reshard.Comm.ucx_cuda(host)
        assert (host.rank, host.size) == (0, 1) and not host.closed
    finally:
        host.close()
    world = reshard.InprocWorld(1)
    c = world.comm(0)
    try:
        with pytest.raises(reshard.InvalidArgumentError, match="Comm.ucx communicator"):
            reshard.Comm.ucx_cuda(c)
    finally:
        c.close()
        world.close()
