from __future__ import annotations

from collectors.spool import SeqCounter, Spool


def test_reports_come_back_oldest_first_and_survive_reopening(tmp_path):
    spool = Spool(tmp_path / "spool")
    for seq in (1, 2, 3):
        spool.append(seq, f"report {seq}".encode())
    assert spool.oldest() == (1, b"report 1")
    spool.remove(1)
    reopened = Spool(tmp_path / "spool")
    assert len(reopened) == 2 and reopened.oldest() == (2, b"report 2") and reopened.highest_seq() == 3


def test_a_full_spool_drops_the_oldest_and_counts_it(tmp_path):
    spool = Spool(tmp_path / "spool", max_reports=3)
    for seq in range(1, 6):
        spool.append(seq, b"x")
    assert len(spool) == 3 and spool.dropped_total == 2
    assert spool.oldest() is not None and spool.oldest()[0] == 3  # type: ignore[index]
    assert sorted(p.name for p in (tmp_path / "spool").iterdir()) == [f"{s:020d}.json" for s in (3, 4, 5)]


def test_seq_only_grows_across_restarts_and_server_hints(tmp_path):
    counter = SeqCounter(tmp_path / "seq")
    assert [counter.next(), counter.next()] == [1, 2]
    again = SeqCounter(tmp_path / "seq")
    assert again.next() == 3
    again.raise_to(100)  # the server holds seq 100 from an earlier life of this node
    assert again.next() == 101
    again.raise_to(5)
    assert again.next() == 102
