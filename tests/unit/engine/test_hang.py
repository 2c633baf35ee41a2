"""Where a stuck run stopped: the record of collectives each rank keeps, the responder thread that answers for a
rank whose main thread is stuck (a real TCPStore on loopback), and the clause the one line gains from the answers.
tests/distributed/test_ddp.py has the whole of it on two Gloo ranks: a rank stuck in Python, and one stopped."""

import json
import re
import socket
import sys
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from ddplab.distributed import Collectives, DistContext, size_text
from ddplab.engine import hang


def test_the_record_keeps_the_last_collectives_with_their_count_and_says_them():
    record = Collectives()
    record.enter("barrier")
    record.bucket(0, False, 25 << 20)
    record.bucket(1, True, 3 << 10)
    record.bucket(0, False, 25 << 20)
    assert [e.seq for e in record.entries] == [1, 2, 3, 4] and record.buckets == 2
    assert record.describe(record.entries[-1]) == "all-reduce #4 (bucket 1 of 2, 25 MiB)"
    assert record.describe(record.entries[0]) == "barrier #1"
    for _ in range(Collectives.KEEP):
        record.enter("all-gather", 12)
    assert len(record.entries) == Collectives.KEEP and record.last().seq == 4 + Collectives.KEEP
    assert (size_text(12), size_text(3 << 10), size_text(1536 << 20)) == ("12 B", "3 KiB", "1.5 GiB")


def answer(seq: int, frame: str = "ddplab/data/loader.py:123 next_batch", op: str = "all-reduce") -> dict:
    return {"frame": frame, "last_seq": seq, "last": f"{op} #{seq} (bucket 3 of 4, 25 MiB)"}


def test_the_clause_names_the_collective_never_entered_and_where_the_rank_is(tmp_path):
    ctx = DistContext(rank=0, world_size=3)
    said = hang.clause({0: answer(1234), 1: answer(1233), 2: answer(1234)}, [1], ctx, tmp_path)
    assert said == (
        ": it never entered all-reduce #1234 (bucket 3 of 4, 25 MiB) and is in ddplab/data/loader.py:123 "
        f"next_batch; stacks in {tmp_path}/hang/"
    )
    said = hang.clause({0: answer(1234), 1: None, 2: answer(1230, "x.py:1 f")}, [1, 2], ctx, tmp_path)
    assert said.startswith(": rank 1 did not answer (stopped, or its host cut off); rank 2 never entered all-reduce")
    assert hang.clause({}, [1], ctx, tmp_path) == ""  # nobody asked (no store): the line as before
    hosts = DistContext(rank=0, world_size=2, hosts=("10.0.0.1", "10.0.0.2"))
    said = hang.clause({0: answer(9), 1: None}, [1], hosts, tmp_path)
    assert said == f": it did not answer (stopped, or its host cut off); stacks in {tmp_path}/hang/ on each host"
    same = hang.clause({0: answer(9), 1: answer(9)}, [1], DistContext(rank=0, world_size=2), tmp_path)
    assert "entered every collective the others did (the last: all-reduce #9" in same


def test_a_frame_is_named_by_its_innermost_place_in_ddplab():
    frame = sys._getframe()
    assert hang.where(frame).startswith("tests/unit/engine/test_hang.py:") or "test_hang.py" in hang.where(frame)
    assert hang.where(frame).endswith("test_a_frame_is_named_by_its_innermost_place_in_ddplab")


@pytest.fixture
def store(monkeypatch):
    """A TCPStore on a free loopback port, as the run's store is, reachable through MASTER_ADDR/MASTER_PORT."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    master = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    yield master


def test_a_responder_answers_from_its_own_thread_with_the_main_threads_place_and_its_record(store, tmp_path):
    ctx = DistContext(rank=0, world_size=2)
    ctx.collectives.bucket(0, True, 4 << 10)
    with hang.responding(ctx, tmp_path) as responder:
        assert responder is not None and responder.thread.is_alive()
        answers = hang.inquire(hang.side_store(), world_size=2, wait_s=1.0)  # rank 1 does not exist: no answer
    assert answers[1] is None and not responder.thread.is_alive()
    mine = answers[0]
    assert mine is not None and mine["last_seq"] == 1 and mine["last"] == "all-reduce #1 (bucket 1 of 1, 4 KiB)"
    assert mine["frame"].startswith("ddplab/engine/hang.py:") and mine["frame"].endswith(" inquire")
    text = (tmp_path / "hang" / "rank-0.txt").read_text()
    assert "all-reduce #1 (bucket 1 of 1, 4 KiB)" in text and "thread MainThread (main):" in text
    assert "in test_a_responder_answers_from_its_own_thread" in text  # the main thread's whole stack
    assert json.loads(store.get("ddplab/attempt_0/hang/answer/0")) == mine


def test_a_run_that_ends_ends_its_responder_and_one_process_has_none(store, tmp_path):
    with hang.responding(DistContext(rank=1, world_size=2), tmp_path) as responder:
        assert responder is not None
    assert not responder.thread.is_alive() and not (tmp_path / "hang").exists()
    with hang.responding(DistContext(), tmp_path) as none:
        assert none is None


def test_a_stalled_data_path_stops_in_the_loader_at_its_batch_and_is_named_there(monkeypatch):
    """DDPLAB_FAULT=stall: the training loader of the rank and epoch named stops before making its S-th batch (not
    the evaluation loader, not another epoch), and the place a hang's line gives is the loader's frame: the fault
    hook's own frames stand for their caller."""
    from ddplab import faults
    from ddplab.data.dataset import ImageDataset
    from ddplab.data.loader import DeviceLoader

    class Stalled(Exception):
        pass

    places = []

    def forever():
        places.append(hang.where(sys._getframe()))
        raise Stalled

    monkeypatch.setattr(faults, "_FAULT", faults.parse("stall:rank=1:epoch=2:step=3"))
    monkeypatch.setattr(faults, "_forever", forever)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    images, labels = torch.zeros(40, 3, 4, 4, dtype=torch.uint8), torch.zeros(40, dtype=torch.int64)
    data = ImageDataset(images, labels, classes=["a"], mean=(0.5,) * 3, std=(0.5,) * 3)
    made = {
        (rank, train): DeviceLoader(data, batch_size=4, device="cpu", train=train, rank=rank, world_size=2)
        for rank in (0, 1)
        for train in (True, False)
    }
    for (rank, train), loader in made.items():
        loader.set_epoch(1)
        assert len(list(loader)) == 5  # epoch 1: every batch
        loader.set_epoch(2)
        batches = iter(loader)
        if rank == 1 and train:
            next(batches), next(batches)
            with pytest.raises(Stalled):
                next(batches)
        else:
            assert len(list(batches)) == 5
    assert len(places) == 1 and re.fullmatch(r"ddplab/data/loader\.py:\d+ __iter__", places[0]), places
