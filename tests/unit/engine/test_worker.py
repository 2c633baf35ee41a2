"""engine/worker.py's words for a membership change, and the record of the round before that they read."""

import json
from types import SimpleNamespace

from ddplab.config import RunConfig
from ddplab.engine.worker import last_round, membership_change
from ddplab.rundir import runfiles


def test_a_lost_host_is_said_with_where_the_round_was_and_a_join_without():
    config = RunConfig()
    config.dist.nnodes = 3
    two = SimpleNamespace(rank_hosts=lambda: ["10.0.0.1", "10.0.0.2"], world_size=2)
    three = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert (
        membership_change(three, two, config, (2, 11))
        == "host 10.0.0.3 lost in epoch 2 after step 11: 2 of 3 nodes (2 workers)"
    )
    assert membership_change(three, two, config) == "host 10.0.0.3 lost: 2 of 3 nodes (2 workers)"
    back = SimpleNamespace(rank_hosts=lambda: three, world_size=3)
    assert membership_change(three[:2], back, config, (2, 11)) == "host 10.0.0.3 joined: 3 of 3 nodes (3 workers)"
    assert membership_change(three, back, config, (2, 11)) is None  # the same hosts: nothing changed


def test_the_round_before_is_read_with_where_it_stopped_and_a_bad_record_is_left_unread(tmp_path):
    """RUN/round.json only adds words to a line: absent, or not such a record, it is left unread."""
    assert last_round(tmp_path) is None
    record = {"hosts": ["10.0.0.1", "10.0.0.2"], "stopped": {"epoch": 2, "step": 11}}
    (tmp_path / runfiles.ROUND).write_text(json.dumps(record))
    assert last_round(tmp_path) == {"hosts": ["10.0.0.1", "10.0.0.2"], "stopped": (2, 11)}
    (tmp_path / runfiles.ROUND).write_text(json.dumps({**record, "stopped": None}))
    assert last_round(tmp_path) == {"hosts": ["10.0.0.1", "10.0.0.2"], "stopped": None}
    (tmp_path / runfiles.ROUND).write_text(json.dumps({**record, "stopped": {"epoch": 2, "step": -1}}))
    assert last_round(tmp_path)["stopped"] is None  # the hosts still say who was there
    for bad in ('{"hosts": []}', '{"hosts": [3]}', '{"hosts": "10.0.0.1"}', "[2, 11]", "{trunc"):
        (tmp_path / runfiles.ROUND).write_text(bad)
        assert last_round(tmp_path) is None, bad
