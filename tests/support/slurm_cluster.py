"""A real Slurm cluster for the tests: munged, slurmctld and slurmd, all state in a temp folder.

One node on localhost, or (`hosts=`) one node per host of a ddplab test cluster (network
namespaces, ddplab.launch.hosts): slurmctld and node0's slurmd in host 0, nodeI's slurmd in host I,
each node at its host's address (NodeAddr), munged's socket on the shared file system.
Debian's `slurm-wlm` and `munge` packages provide the daemons; they run as root (`.ci/run`
installs them). `SlurmCluster.env` is what a process needs to talk to this cluster
(SLURM_CONF), and `prefix` what to put before its command (on test hosts: run it in host 0,
the only place the controller is reachable from); jobs inherit both. Where the daemons or
root are missing, `why_not()` says so and the tests that need a cluster skip with that reason.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "srun", "scancel")


def why_not() -> str | None:
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing:
        return f"no Slurm here ({', '.join(missing)} missing: apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "a test Slurm cluster's daemons run as root"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_line(name: str = "localhost", address: str = "127.0.0.1") -> str:
    """This machine as slurmd sees it (CPUs, sockets, cores, memory), as node `name` at `address`."""
    found = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    fields = [f for f in found.split() if not f.startswith(("NodeName=", "UpTime="))]
    memory = next((f for f in fields if f.startswith("RealMemory=")), None)
    fields = [f for f in fields if f != memory]
    return " ".join([f"NodeName={name}", f"NodeAddr={address}", *fields, "State=UNKNOWN"])


class SlurmCluster:
    def __init__(self, root: Path, hosts=None):
        self.root, self.hosts = root, hosts
        self.procs: list[subprocess.Popen] = []
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        # The daemons enter a host's network namespace only: `ip netns exec` would also mount a sysfs of the
        # namespace's own, without the cgroup file system slurmd needs.
        self.daemon_prefix = (
            (lambda i: ["nsenter", f"--net=/run/netns/{hosts.host(i)}"]) if hosts is not None else (lambda i: [])
        )
        self.prefix = hosts.exec_prefix(0) if hosts is not None else []
        count = hosts.hosts if hosts is not None else 1
        self.nodes = [f"node{i}" for i in range(count)] if hosts is not None else ["localhost"]
        self.addresses = [hosts.address(i) for i in range(count)] if hosts is not None else ["127.0.0.1"]

    def start(self, timeout_s: float = 60) -> SlurmCluster:
        root = self.root
        for sub in ("state", "spool", "munge"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        (root / "munge").chmod(0o700)
        key = root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        socket_path = root / "munge" / "munge.socket"
        self.procs.append(
            subprocess.Popen(
                [
                    "munged",
                    "--foreground",
                    "--force",
                    f"--socket={socket_path}",
                    f"--key-file={key}",
                    f"--pid-file={root / 'munge' / 'munged.pid'}",
                    f"--log-file={root / 'munge' / 'munged.log'}",
                    f"--seed-file={root / 'munge' / 'munged.seed'}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
        )
        self.wait_for(lambda: socket_path.exists(), timeout_s, "munged's socket")
        self.conf.write_text(
            "\n".join(
                [
                    # Named localhost, as slurmctld accepts on any host (it checks its host's name):
                    # reached at the address.
                    "ClusterName=ddplabtest",
                    f"SlurmctldHost=localhost({self.addresses[0]})",
                    f"SlurmctldPort={free_port()}",
                    f"SlurmdPort={free_port()}",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={socket_path}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    f"StateSaveLocation={root / 'state'}",
                    f"SlurmdSpoolDir={root / 'spool' / '%n'}",
                    f"SlurmctldPidFile={root / 'slurmctld.pid'}",
                    f"SlurmdPidFile={root / 'slurmd-%n.pid'}",
                    f"SlurmctldLogFile={root / 'slurmctld.log'}",
                    f"SlurmdLogFile={root / 'slurmd-%n.log'}",
                    "ProctrackType=proctrack/pgid",
                    "TaskPlugin=task/none",
                    "MpiDefault=none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU",
                    "SchedulerType=sched/builtin",
                    "ReturnToService=2",
                    "MinJobAge=600",
                    "KillWait=30",
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/none",
                    "SlurmctldTimeout=30",
                    "SlurmdTimeout=30",
                    "InactiveLimit=0",
                    *(node_line(n, a) for n, a in zip(self.nodes, self.addresses, strict=True)),
                    f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )
        self.procs.append(
            subprocess.Popen(
                [*self.daemon_prefix(0), "slurmctld", "-D", "-i", "-f", str(self.conf)],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
        )
        for i, node in enumerate(self.nodes):
            (root / "spool" / node).mkdir(parents=True, exist_ok=True)
            self.procs.append(
                subprocess.Popen(
                    [*self.daemon_prefix(i), "slurmd", "-D", "-N", node, "-f", str(self.conf)],
                    env=self.env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.STDOUT,
                )
            )
        self.wait_for(
            lambda: (
                set(self.node_states().values()) <= {"idle", "mixed", "allocated"}
                and len(self.node_states()) == len(self.nodes)
            ),
            timeout_s,
            "the nodes to come up",
        )
        return self

    def node_states(self) -> dict[str, str]:
        proc = subprocess.run(
            [*self.prefix, "sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, env=self.env
        )
        return (
            dict(line.split() for line in proc.stdout.splitlines() if len(line.split()) == 2)
            if proc.returncode == 0
            else {}
        )

    def wait_for(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(
                    f"test Slurm cluster: {what} never came ({', '.join(dead) or 'timed out'}); "
                    f"logs in {self.root}:\n{self.logs()}"
                )
            time.sleep(0.2)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(self.root.glob("*.log")))

    def stop(self) -> None:
        subprocess.run([*self.prefix, "scancel", "--full", "--user", "root"], env=self.env, capture_output=True)
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
