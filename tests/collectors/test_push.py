"""The push thread's handling of the server's acknowledgements (collectors/push.py)."""

from __future__ import annotations

import json

import httpx

from collectors.push import Pusher
from collectors.spool import Spool
from collectors.wire import Reply
from sentinel.telemetry.schemas import NodeRegistration, ReportAck


class ScriptedLink:
    """Test double for collectors.wire.ReportLink: answers each POST with the next scripted acknowledgement."""

    def __init__(self, answers: list[dict[str, object]]):
        self.answers = answers

    def post(self, path: str, body: bytes) -> Reply:
        # compact, as the server's response model writes it
        return Reply(200, json.dumps(self.answers.pop(0), separators=(",", ":")).encode())


def ack(seq: int, pids: list[int], **extra: object) -> dict[str, object]:
    return {"status": "accepted", "node": "n1", "seq": seq, "commands": [], "cleared": [], "probe_targets": None,
            "assignments": [{"job_id": 1, "rank": r, "pid": p, "accelerators": [], "engine": None}
                            for r, p in enumerate(pids)], **extra}


def test_an_acknowledgement_that_repeats_the_last_is_not_applied_again_unless_it_brings_something(tmp_path):
    command = {"id": "c1", "kind": "inject", "accelerator_index": 0, "fault": "xid", "argument": None, "spec": None}
    answers = [ack(1, [10]), ack(2, [10]), ack(3, [10]),  # the same assignments: applied once
               ack(4, [10, 11]),  # changed: applied
               ack(5, [10, 11], commands=[command]), ack(6, [10, 11], commands=[command]),  # commands: each applied
               ack(7, [10, 11], cleared=["SIM-n1-0"]), ack(8, [10, 11], cleared=["SIM-n1-0"]),  # so is a clear
               ack(9, [10, 11]), ack(10, [10, 11]),  # after them, once more, then repeats are not
               ack(11, [10, 11, 12]), ack(12, [10, 11, 12])]  # a change that failed to apply: its repeat is applied
    applied: list[ReportAck] = []
    fail_at = {11}

    def on_ack(a: ReportAck) -> None:
        if a.seq in fail_at:
            fail_at.discard(a.seq)
            raise RuntimeError("could not apply")
        applied.append(a)

    spool = Spool(tmp_path / "spool")
    pusher = Pusher(client=httpx.Client(), link=ScriptedLink(answers), node="n1", spool=spool,  # type: ignore[arg-type]
                    registration=lambda: NodeRegistration(name="n1"), on_ack=on_ack, on_registered=lambda _: None)
    for seq in range(1, 13):
        spool.append(seq, b"{}")
        assert pusher._send(seq, b"{}")
    assert [a.seq for a in applied] == [1, 4, 5, 6, 7, 8, 9, 12]
    assert pusher.sent_total == 12 and len(spool) == 0
