"""A real one-node Slurm cluster for the tests: munged, slurmctld and slurmd on localhost, all state in a temp folder.

Debian's `slurm-wlm` and `munge` packages provide the daemons; they run as root (`.ci/run`
installs them). `SlurmCluster.env` is what a process needs to talk to this cluster
(SLURM_CONF); jobs inherit it. Where the daemons or root are missing, `why_not()` says so
and the tests that need a cluster skip with that reason.
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


def node_line() -> str:
    """This machine as slurmd sees it (CPUs, sockets, cores, memory), named localhost."""
    found = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    fields = [f for f in found.split() if not f.startswith(("NodeName=", "UpTime="))]
    memory = next((f for f in fields if f.startswith("RealMemory=")), None)
    fields = [f for f in fields if f != memory]
    return " ".join(["NodeName=localhost", "NodeAddr=127.0.0.1", *fields, "State=UNKNOWN"])


class SlurmCluster:
    def __init__(self, root: Path):
        self.root = root
        self.procs: list[subprocess.Popen] = []
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self, timeout_s: float = 60) -> SlurmCluster:
        root = self.root
        for sub in ("state", "spool", "munge"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        (root / "munge").chmod(0o700)
        key = root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        socket_path = root / "munge" / "munge.socket"
        self.procs.append(subprocess.Popen(
            ["munged", "--foreground", "--force", f"--socket={socket_path}", f"--key-file={key}",
             f"--pid-file={root / 'munge' / 'munged.pid'}", f"--log-file={root / 'munge' / 'munged.log'}",
             f"--seed-file={root / 'munge' / 'munged.seed'}"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        self.wait_for(lambda: socket_path.exists(), timeout_s, "munged's socket")
        self.conf.write_text("\n".join([
            "ClusterName=ddplabtest", "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={free_port()}", f"SlurmdPort={free_port()}",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={socket_path}",
            "SlurmUser=root", "SlurmdUser=root",
            f"StateSaveLocation={root / 'state'}", f"SlurmdSpoolDir={root / 'spool'}",
            f"SlurmctldPidFile={root / 'slurmctld.pid'}", f"SlurmdPidFile={root / 'slurmd.pid'}",
            f"SlurmctldLogFile={root / 'slurmctld.log'}", f"SlurmdLogFile={root / 'slurmd.log'}",
            "ProctrackType=proctrack/pgid", "TaskPlugin=task/none", "MpiDefault=none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/builtin", "ReturnToService=2", "MinJobAge=600", "KillWait=30",
            "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none",
            "SlurmctldTimeout=30", "SlurmdTimeout=30", "InactiveLimit=0",
            node_line(), "PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP", ""]))
        self.procs.append(subprocess.Popen(["slurmctld", "-D", "-i", "-f", str(self.conf)], env=self.env,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        self.procs.append(subprocess.Popen(["slurmd", "-D", "-N", "localhost", "-f", str(self.conf)], env=self.env,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        self.wait_for(lambda: self.node_state() in ("idle", "mixed", "allocated"), timeout_s, "the node to come up")
        return self

    def node_state(self) -> str:
        proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, env=self.env)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    def wait_for(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"test Slurm cluster: {what} never came ({', '.join(dead) or 'timed out'}); "
                                   f"logs in {self.root}:\n{self.logs()}")
            time.sleep(0.2)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(self.root.glob("*.log")))

    def stop(self) -> None:
        subprocess.run(["scancel", "--full", "--user", "root"], env=self.env, capture_output=True)
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
