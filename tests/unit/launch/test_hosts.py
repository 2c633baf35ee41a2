"""The test cluster's arithmetic and refusals, without making a host (ddplab.launch.hosts; the hosts themselves are
made for real in tests/distributed/test_network.py)."""

import os
import subprocess

import pytest

from ddplab.launch import hosts
from ddplab.launch.hosts import Cluster, HostsError, parse_rate, rate_text


@pytest.mark.parametrize(
    "text, bits",
    [
        ("100mbit", 100e6),
        ("1gbit", 1e9),
        ("2.5gbit", 2.5e9),
        ("500k", 5e5),
        ("1G", 1e9),
        ("10mbps", 80e6),
        ("64kbit", 64e3),
    ],
)
def test_rates_read_as_tc_spells_them(text, bits):
    assert parse_rate(text) == pytest.approx(bits)


@pytest.mark.parametrize("text", [None, "none", "unshaped", " Off "])
def test_no_rate_is_an_unshaped_link(text):
    assert parse_rate(text) is None


@pytest.mark.parametrize(
    "text, why",
    [
        ("fast", "expected e.g. 100mbit"),
        ("1tbit", "expected e.g."),
        ("1kbit", "between 8kbit and 100gbit"),
        ("200gbit", "between 8kbit and 100gbit"),
        ("-5mbit", "expected e.g."),
        ("", "expected e.g."),  # an unset shell variable: refused, not read as "none" (every link unshaped)
        ("  ", "expected e.g."),
    ],
)
def test_bad_rates_are_refused_in_one_line(text, why):
    with pytest.raises(HostsError, match=why):
        parse_rate(text)


def test_rates_print_in_the_largest_whole_unit():
    assert [rate_text(r) for r in (None, 2e8, 1e9, 2.5e9, 64e3)] == [
        "unshaped",
        "200mbit",
        "1gbit",
        "2.5gbit",
        "64kbit",
    ]


def test_hosts_are_numbered_from_the_first_address_of_the_subnet():
    cluster = Cluster("c", 3, None)
    assert [cluster.address(i) for i in range(3)] == ["10.211.0.1", "10.211.0.2", "10.211.0.3"]
    assert [cluster.host(i) for i in range(3)] == ["c-h0", "c-h1", "c-h2"]
    assert cluster.endpoint(1234) == "10.211.0.1:1234" and cluster.switch == "c-sw"
    assert cluster.exec_prefix(2) == ["ip", "netns", "exec", "c-h2"]
    with pytest.raises(HostsError, match="host 3 is not in cluster 'c', whose hosts are 0..2"):
        cluster.address(3)


def test_without_root_it_says_so_in_one_line(monkeypatch):
    monkeypatch.setattr(hosts.os, "geteuid", lambda: 1000)
    for command in (lambda: hosts.up(2), hosts.down, hosts.status, lambda: hosts.reshape("ddplab", "1gbit")):
        with pytest.raises(HostsError, match=r"need root: run as root \(e\.g\. sudo ddplab hosts"):
            command()
    assert hosts.why_not_available().startswith("test hosts are network namespaces, which need root")


def test_without_iproute2_it_says_which_package(monkeypatch):
    monkeypatch.setattr(hosts.os, "geteuid", lambda: 0)
    monkeypatch.setattr(hosts.shutil, "which", lambda name: None)
    with pytest.raises(HostsError, match=r"iproute2's `ip` \(apt-get install iproute2\)"):
        hosts.check_can_make()


@pytest.mark.parametrize("name", ["", "Ab", "a-b", "x" * 13, "1abc"])
def test_cluster_names_fit_interface_and_namespace_names(name):
    with pytest.raises(HostsError, match="1 to 12 lower-case letters and digits"):
        hosts.up(1, name=name)


def test_sigterm_while_hosts_come_up_takes_down_what_was_made(monkeypatch, tmp_path):
    """SIGTERM during `hosts up` left namespaces behind (Ctrl-C cleaned up): every stop signal is a stop, and
    `up` takes down what it made on any way out."""
    import signal

    from ddplab import cli

    monkeypatch.setattr(hosts, "check_can_make", lambda: None)
    monkeypatch.setattr(hosts, "STATE_DIR", tmp_path)
    made = []

    def ip(args, *, check=True, namespace=None):
        if args[:2] == ["netns", "add"]:
            made.append(args[2])
            if len(made) == 2:  # the switch and one host made: a scheduler's SIGTERM arrives
                os.kill(os.getpid(), signal.SIGTERM)
        return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setattr(hosts, "_ip", ip)
    monkeypatch.setattr(hosts, "_namespaces", lambda: set())
    taken_down = []
    monkeypatch.setattr(hosts, "_down", lambda name, missing_ok=False: taken_down.append(name) or [])
    assert cli.main(["hosts", "up", "3", "--name", "drill"]) == 130
    assert made == ["drill-sw", "drill-h0"] and taken_down == ["drill"]


def test_a_second_command_on_a_cluster_being_made_is_refused_and_takes_nothing_down(monkeypatch, tmp_path):
    """Two `hosts up` of one name raced: the loser's clean-up took down the winner's hosts. Now one command at a
    time makes or removes a cluster: the other is refused at once, touching nothing."""
    import fcntl

    monkeypatch.setattr(hosts, "check_can_make", lambda: None)
    monkeypatch.setattr(hosts, "STATE_DIR", tmp_path)
    touched = []
    monkeypatch.setattr(hosts, "_ip", lambda args, **kw: touched.append(args))
    monkeypatch.setattr(hosts, "_down", lambda name, missing_ok=False: touched.append(["down", name]) or [])
    with open(tmp_path / "drill.lock", "w") as held:  # the first command, still making its hosts
        fcntl.flock(held, fcntl.LOCK_EX)
        for command in (lambda: hosts.up(2, name="drill"), lambda: hosts.down("drill")):
            with pytest.raises(
                HostsError, match="another `ddplab hosts` command is making or removing cluster 'drill'"
            ):
                command()
    assert touched == []
