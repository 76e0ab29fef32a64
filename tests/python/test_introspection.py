"""Plan.peer_stats, Plan.dump, Plan.refuse and Layout.add_fused from
Python (no test called them): each against what the layouts say,
worked out here independently, on in-process ranks (reshard.SelfTest:
values from global coordinates, padding checked untouched)."""
import pytest

import reshard
from conftest import run_ranks

ROWS, COLS = 8, 16  # f32


def rows_to_cols():
    """A ROWS x COLS f32 tensor: rows split over ranks 0-1, columns over
    ranks 2-3. Each source sends each destination a ROWS/2 x COLS/2 box."""
    src, dst = reshard.Layout(), reshard.Layout()
    t = src.add_tensor("w", "f32", (ROWS, COLS))
    src.place(t, src.add_mesh(2, start=0), [reshard.Shard(0)])
    t = dst.add_tensor("w", "f32", (ROWS, COLS))
    dst.place(t, dst.add_mesh(2, start=2), [reshard.Shard(1)])
    return src, dst


def test_peer_stats_and_dump():
    box = (ROWS // 2) * (COLS // 2) * 4

    def fn(rank, comm):
        src, dst = rows_to_cols()
        with reshard.Plan(comm, src, dst) as plan:
            peers = plan.peer_stats()
            st = plan.stats()
            text = plan.dump()
        return peers, st, text

    out = run_ranks(4, fn)
    for rank, (peers, st, text) in enumerate(out):
        sources = rank < 2
        want = [2, 3] if sources else [0, 1]
        assert [p.peer for p in peers] == want, (rank, peers)
        for p in peers:
            assert (p.send_bytes, p.recv_bytes) == ((box, 0) if sources else (0, box)), (rank, p)
            assert (p.send_messages >= 1) == sources and (p.recv_messages >= 1) != sources
        assert sum(p.send_bytes for p in peers) == st.send_bytes
        assert sum(p.recv_bytes for p in peers) == st.recv_bytes
        assert sum(p.send_messages for p in peers) == st.send_messages
        # the dump is this rank's plan: its rank, its totals, its peers
        assert text and "rank %d" % rank in text, text
        assert str(st.send_bytes if sources else st.recv_bytes) in text, text
        for p in want:
            assert str(p) in text


def test_refuse_names_the_rank_and_reason_to_partners():
    def fn(rank, comm):
        src, dst = rows_to_cols()
        with reshard.Plan(comm, src, dst, timeout_ms=10000) as plan, \
                reshard.SelfTest(src, rank, 1) as s, reshard.SelfTest(dst, rank, -1) as d:
            bound = plan.bind({src.buffer_name(b): a for b, a in s.arrays.items()},
                              {dst.buffer_name(b): a for b, a in d.arrays.items()})
            before = {b: bytes(memoryview(a).cast("B")) for b, a in d.arrays.items()}
            if rank == 0:
                plan.refuse("the trainer's step 1 has no weights yet", version=1)
                err = None
            else:
                with pytest.raises(reshard.Error) as e:
                    plan.execute(bound, version=1)
                err = e.value
            untouched = sum(bytes(memoryview(a).cast("B")) != before[b] for b, a in d.arrays.items())
            return err, plan.status(), untouched

    out = run_ranks(4, fn)
    for rank, (err, status, untouched) in enumerate(out):
        assert status.failed and status.failed_version == 1, (rank, status)
        assert untouched == 0, rank  # nothing written anywhere
        if rank == 0:
            assert "no weights yet" in status.failure_message
            continue
        # the partners of rank 0 (ranks 2, 3) hear its reason; rank 1
        # hears through them or its own partners' headers
        assert isinstance(err, (reshard.RemoteError, reshard.MismatchError)), (rank, err)
        if rank in (2, 3):
            assert "rank 0" in str(err) and "no weights yet" in str(err), (rank, err)


def test_add_fused_moves_each_part_byte_for_byte():
    # q (8 x 16) and k (4 x 16) fused along rows, tp 2 on ranks 2-3: each
    # rank's buffer is [q shard; k shard] (6 x 16); the trainer holds them
    # unfused on rank 0 and 1.
    def layouts():
        src, dst = reshard.Layout(), reshard.Layout()
        for L in (src, dst):
            L.add_tensor("q", "f32", (8, 16))
            L.add_tensor("k", "f32", (4, 16))
        src.place("q", src.add_mesh(1, start=0), [reshard.Replicate()])
        src.place("k", src.add_mesh(1, start=1), [reshard.Replicate()])
        m = dst.add_mesh(2, start=2)
        b = dst.add_fused("qk", [reshard.Part("q", m, [reshard.Shard(0)]),
                                 reshard.Part("k", m, [reshard.Shard(0)])])
        return src, dst, b

    def fn(rank, comm):
        src, dst, b = layouts()
        with reshard.Plan(comm, src, dst) as plan, \
                reshard.SelfTest(src, rank, -1) as s, reshard.SelfTest(dst, rank, -1) as d:
            bound = plan.bind({src.buffer_name(b): a for b, a in s.arrays.items()},
                              {dst.buffer_name(b): a for b, a in d.arrays.items()})
            wrong = 0
            for step in (1, 2):
                s.fill(step)
                plan.execute(bound, version=step)
                wrong += d.check(step, "fused")
            nbytes = dst.buffer_bytes(b, rank) if rank >= 2 else 0
            frags = [(f.name, f.buffer) for f in dst.fragments(rank)] if rank >= 2 else []
            return wrong, nbytes, frags

    out = run_ranks(4, fn)
    for rank, (wrong, nbytes, frags) in enumerate(out):
        assert wrong == 0, rank
        if rank >= 2:
            assert nbytes == (4 + 2) * 16 * 4, (rank, nbytes)  # q rows 4, k rows 2
            assert [n for n, _ in frags] == ["q", "k"], frags
