"""Hosts with their own addresses on one machine: a test cluster made of network namespaces.

Loopback is not a network. Multi-node DDP meets what loopback never shows: an interface to
pick, a link of finite speed, a link that goes down, a host that dies. Here each host is a
network namespace with one interface, `eth0`, holding 10.211.0.(i+1)/24; every `eth0` is a
veth pair whose other end hangs on a bridge in a namespace of its own (the switch), so the
machine's own network is never touched. Each link can be shaped (tc `tbf`, both directions;
a rate only: no delay or loss, which need `netem`, missing from some kernels) and set down or up.

Processes run in a host with `ip netns exec` (`ddplab hosts exec I -- CMD`); the file
system is shared, as on a cluster with a shared disk. `ddplab hosts down` kills what still
runs in the hosts before it deletes them. The tests, the benchmarks and `ddplab hosts` use
this module alike. Needs root and iproute2; torch-free.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ddplab.errors import DdplabError
from ddplab.io.arguments import link_rate

SUBNET = ipaddress.ip_network("10.211.0.0/24")
DEFAULT_NAME = "ddplab"
MAX_HOSTS = 64
STATE_DIR = Path(
    "/run/ddplab-hosts"
)  # what `up` made, for `status`, `link` and `down` (gone at reboot, as the namespaces are)


class HostsError(DdplabError):
    """The test cluster cannot be made, found or changed; the message says why."""

    exit_code = 2


@dataclass(frozen=True)
class Cluster:
    name: str
    hosts: int
    rate_bit_s: float | None  # None: the link is not shaped (veth's own speed, several Gbit/s)

    @property
    def switch(self) -> str:
        return f"{self.name}-sw"

    def host(self, i: int) -> str:
        """Host i's namespace name."""
        self._check(i)
        return f"{self.name}-h{i}"

    def address(self, i: int) -> str:
        self._check(i)
        return str(SUBNET.network_address + i + 1)

    def endpoint(self, port: int = 29500) -> str:
        """The rendezvous endpoint of a run whose store lives on host 0."""
        return f"{self.address(0)}:{port}"

    def exec_prefix(self, i: int) -> list[str]:
        """What to put before a command to run it in host i."""
        return ["ip", "netns", "exec", self.host(i)]

    def _check(self, i: int) -> None:
        if not 0 <= i < self.hosts:
            raise HostsError(f"host {i} is not in cluster {self.name!r}, whose hosts are 0..{self.hosts - 1}")


def parse_rate(text: str | None) -> float | None:
    """A link rate as `ddplab hosts` takes it (io/arguments.link_rate), its refusal a HostsError."""
    try:
        return link_rate(text)
    except ValueError as exc:
        raise HostsError(str(exc)) from None


def as_rate(rate: str | float | None) -> float | None:
    """Bits per second from a rate as a user spells it, or as a number already."""
    return float(rate) if isinstance(rate, (int, float)) else parse_rate(rate)


def rate_text(rate_bit_s: float | None) -> str:
    if rate_bit_s is None:
        return "unshaped"
    for unit, size in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if rate_bit_s >= size:
            return f"{rate_bit_s / size:g}{unit}"
    return f"{rate_bit_s:g}bit"


def check_can_make() -> None:
    """One line saying why hosts cannot be made here, or nothing."""
    if os.geteuid() != 0:
        raise HostsError("test hosts are network namespaces, which need root: run as root (e.g. sudo ddplab hosts ...)")
    if shutil.which("ip") is None:
        raise HostsError("test hosts need iproute2's `ip` (apt-get install iproute2)")
    if shutil.which("tc") is None:
        raise HostsError("test hosts need iproute2's `tc` to shape links (apt-get install iproute2)")


def why_not_available() -> str | None:
    """The reason hosts cannot be made here (for a test's skip), or None when they can."""
    try:
        check_can_make()
    except HostsError as exc:
        return str(exc)
    probe = f"ddplabprobe{os.getpid()}"
    made = _ip(["netns", "add", probe], check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip() or 'ip netns add failed'}"
    _ip(["netns", "del", probe], check=False)
    return None


def _ip(args: Sequence[str], *, check: bool = True, namespace: str | None = None) -> subprocess.CompletedProcess:
    return _run(["ip", *(["-n", namespace] if namespace else []), *args], check=check)


def _run(cmd: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, errors="replace", timeout=30)
    if check and proc.returncode != 0:
        raise HostsError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip() or proc.stdout.strip() or proc.returncode}")
    return proc


def _namespaces() -> set[str]:
    proc = _ip(["netns", "list"], check=False)
    return {line.split()[0] for line in proc.stdout.splitlines() if line.strip()}


def _state_file(name: str) -> Path:
    return STATE_DIR / f"{name}.json"


def _check_name(name: str) -> None:
    if not re.fullmatch(r"[a-z][a-z0-9]{0,11}", name):
        raise HostsError(f"cluster name {name!r}: 1 to 12 lower-case letters and digits, starting with a letter")


def up(hosts: int, rate: str | float | None = None, *, name: str = DEFAULT_NAME) -> Cluster:
    """Make `hosts` hosts joined by a switch, each link shaped to `rate` (both ways). A cluster of this
    name must not exist; what was made is taken down again if any step fails (or on Ctrl-C)."""
    _check_name(name)
    if not 1 <= hosts <= MAX_HOSTS:
        raise HostsError(f"hosts: {hosts}: must be between 1 and {MAX_HOSTS}")
    rate_bit_s = as_rate(rate)
    check_can_make()
    with changing(name):
        return _up(Cluster(name, hosts, rate_bit_s))


def _up(cluster: Cluster) -> Cluster:
    name, hosts, rate_bit_s = cluster.name, cluster.hosts, cluster.rate_bit_s
    taken = _namespaces() & {cluster.switch, *(f"{name}-h{i}" for i in range(hosts))}
    if taken or _state_file(name).exists():
        raise HostsError(f"a test cluster named {name!r} exists already: `ddplab hosts down --name {name}` first")
    try:
        _ip(["netns", "add", cluster.switch])
        _ip(["link", "add", "br0", "type", "bridge"], namespace=cluster.switch)
        _ip(["link", "set", "br0", "up"], namespace=cluster.switch)
        for i in range(hosts):
            ns = cluster.host(i)
            _ip(["netns", "add", ns])
            # Made inside the host, its peer sent to the switch: the machine's own namespace never sees either end.
            _ip(
                ["link", "add", "eth0", "type", "veth", "peer", "name", f"port{i}", "netns", cluster.switch],
                namespace=ns,
            )
            _ip(["addr", "add", f"{cluster.address(i)}/{SUBNET.prefixlen}", "dev", "eth0"], namespace=ns)
            _ip(["link", "set", "lo", "up"], namespace=ns)
            _ip(["link", "set", "eth0", "up"], namespace=ns)
            _ip(["link", "set", f"port{i}", "master", "br0"], namespace=cluster.switch)
            _ip(["link", "set", f"port{i}", "up"], namespace=cluster.switch)
            shape_link(cluster, i, rate_bit_s)
        _state_file(name).write_text(json.dumps(asdict(cluster)))
    except BaseException:
        _down(name, missing_ok=True)
        raise
    return cluster


@contextlib.contextmanager
def changing(name: str) -> Iterator[None]:
    """One `ddplab hosts` command at a time makes or removes a cluster of one name: two `up`s of a name raced,
    and the loser's clean-up took down the winner's hosts. The lock dies with its holder."""
    import fcntl

    STATE_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(STATE_DIR / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise HostsError(
                f"another `ddplab hosts` command is making or removing cluster {name!r} right now: let it finish, "
                "then try again"
            ) from None
        yield
    finally:
        os.close(fd)


def shape_link(cluster: Cluster, i: int, rate_bit_s: float | None) -> None:
    """Host i's link at `rate_bit_s` both ways (token bucket on each end's egress), or unshaped."""
    for ns, dev in ((cluster.host(i), "eth0"), (cluster.switch, f"port{i}")):
        _run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)
        if rate_bit_s is not None:
            # A burst of 10 ms at the rate (never below 64 KiB, one GSO packet); up to 100 ms queued.
            burst = max(64 * 1024, int(rate_bit_s / 8 / 100))
            _run(
                [
                    "tc",
                    "-n",
                    ns,
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    "root",
                    "tbf",
                    "rate",
                    f"{int(rate_bit_s)}bit",
                    "burst",
                    str(burst),
                    "latency",
                    "100ms",
                ]
            )


def reshape(name: str, rate: str | float | None) -> Cluster:
    """Every link of cluster `name` at a new rate (or unshaped)."""
    made = find(name)
    made = Cluster(made.name, made.hosts, as_rate(rate))
    for i in range(made.hosts):
        shape_link(made, i, made.rate_bit_s)
    _state_file(name).write_text(json.dumps(asdict(made)))
    return made


def set_link(cluster: Cluster, i: int, state: str) -> None:
    """Host i's link `down` (its cable pulled: nothing in or out, its own processes live on) or `up`."""
    if state not in ("up", "down"):
        raise HostsError(f"link state {state!r}: up or down")
    _ip(["link", "set", f"port{i}", state], namespace=cluster.switch)


def link_is_up(cluster: Cluster, i: int) -> bool:
    out = _ip(["-o", "link", "show", f"port{i}"], namespace=cluster.switch).stdout
    return "state DOWN" not in out and ",UP" in out.replace("<UP", ",UP")


def find(name: str = DEFAULT_NAME) -> Cluster:
    """The cluster `up` made under this name."""
    _check_name(name)
    check_can_make()
    try:
        data = json.loads(_state_file(name).read_text())
        cluster = Cluster(
            str(data["name"]), int(data["hosts"]), None if data["rate_bit_s"] is None else float(data["rate_bit_s"])
        )
    except FileNotFoundError:
        raise HostsError(f"no test cluster named {name!r}: make one with `ddplab hosts up N`") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise HostsError(
            f"{_state_file(name)}: unreadable ({exc}); `ddplab hosts down --name {name}` clears it"
        ) from None
    if cluster.switch not in _namespaces():
        raise HostsError(
            f"test cluster {name!r} is recorded but its namespaces are gone: "
            f"`ddplab hosts down --name {name}` clears the record"
        )
    return cluster


def processes_in(namespace: str) -> list[int]:
    proc = _ip(["netns", "pids", namespace], check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit()]


def down(name: str = DEFAULT_NAME, *, missing_ok: bool = False) -> list[int]:
    """Kill what runs in the hosts (SIGTERM, SIGKILL after 5 s) and delete them and the switch.
    Returns the process ids that were still running."""
    _check_name(name)
    check_can_make()
    with changing(name):
        return _down(name, missing_ok=missing_ok)


def _down(name: str, *, missing_ok: bool = False) -> list[int]:
    try:
        recorded = json.loads(_state_file(name).read_text())["hosts"]
    except (OSError, ValueError, KeyError, TypeError):
        recorded = None
    prefix, existing = f"{name}-h", _namespaces()
    namespaces = sorted(ns for ns in existing if ns.startswith(prefix) and ns[len(prefix) :].isdigit())
    namespaces += [f"{name}-sw"] if f"{name}-sw" in existing else []
    if not namespaces and recorded is None and not missing_ok:
        raise HostsError(f"no test cluster named {name!r}")
    stopped = stop_processes([pid for ns in namespaces for pid in processes_in(ns)])
    for ns in namespaces:
        _ip(["netns", "del", ns], check=False)
    with contextlib.suppress(FileNotFoundError):
        _state_file(name).unlink()
    return stopped


def stop_processes(pids: Sequence[int], grace_s: float = 5.0) -> list[int]:
    """SIGTERM each, SIGKILL what is left after `grace_s`."""
    alive = [p for p in pids if _signal(p, signal.SIGTERM)]
    deadline = time.monotonic() + grace_s
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _alive(p)]
    for pid in alive:
        _signal(pid, signal.SIGKILL)
    return list(pids)


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


_made = itertools.count()  # clusters made by this process, for their default names


@contextlib.contextmanager
def cluster(hosts: int, rate: str | float | None = None, *, name: str | None = None) -> Iterator[Cluster]:
    """A cluster for the length of a block (a test, a benchmark): always taken down, with whatever
    still runs in it, also on an error or Ctrl-C. The default name is unique to this process and call."""
    name = name or f"t{os.getpid() % 10**6}x{next(_made)}"
    made = up(hosts, rate, name=name)
    try:
        yield made
    finally:
        down(name, missing_ok=True)


def status(name: str = DEFAULT_NAME) -> list[dict]:
    """One row per host: its namespace, address, link state and rate, processes running in it."""
    made = find(name)
    return [
        {
            "host": i,
            "namespace": made.host(i),
            "address": made.address(i),
            "link": "up" if link_is_up(made, i) else "down",
            "rate": rate_text(made.rate_bit_s),
            "processes": len(processes_in(made.host(i))),
        }
        for i in range(made.hosts)
    ]
