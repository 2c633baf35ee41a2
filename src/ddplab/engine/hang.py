"""Where a stuck run stopped: when a collective times out, every rank that can still answer writes where it is (all
its threads' Python stacks) and the last collectives it entered to RUN/hang/rank-R.txt, and the ranks that timed
out say, in their one line, which rank never entered the collective the others wait in and the frame it is in.

Each rank of a run of several starts a responder thread at once, blocked on a key of its own in the run's store
(over a connection of its own: the group's is busy, or broken, by then), so a rank whose main thread is stuck in
Python still answers. A rank that is stopped (SIGSTOP), or whose host is cut off, does not, and is named so. The
record of collectives is ddplab's own (distributed.Collectives, filled by the comm hook and DistContext); where the
installed torch keeps one (Gloo's and NCCL's on torch 2.13), torch's Flight Recorder dump is written beside it
(rank-R.fr.pkl).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from ddplab import internals
from ddplab.distributed import DistContext
from ddplab.topology import group_attempt

FOLDER = "hang"
ANSWER_WAIT_S = 2.0  # how long the ranks that timed out wait for the others' answers
PACKAGE = Path(__file__).resolve().parents[1]  # src/ddplab: a frame of ours is named from here
FAULT_HOOK = str(PACKAGE / "faults.py")  # a test's fault plays stuck where it is called: its caller is the place


def side_store(timeout_s: float = 30.0) -> dist.Store | None:
    """A connection of our own to the run's store (the one the group met in), under this attempt's prefix, made
    within `timeout_s` (a store on a host cut off is given up on); None where there is none to reach (no
    MASTER_ADDR, or no answer)."""
    if "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
        return None
    try:
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
    except (RuntimeError, ValueError, OSError):
        return None
    return dist.PrefixStore(f"ddplab/attempt_{group_attempt()}/hang", store)


def where(frame) -> str:
    """A thread's place, as a line says it: its innermost frame in ddplab's code ("ddplab/data/loader.py:123
    next_batch"; the fault hook's frames stand for their caller), else its innermost frame."""
    stack = traceback.extract_stack(frame)
    ours = [f for f in stack if f.filename.startswith(str(PACKAGE)) and f.filename != FAULT_HOOK]
    f = (ours or stack)[-1]
    name = Path(f.filename)
    shown = name.relative_to(PACKAGE.parent) if name.is_relative_to(PACKAGE.parent) else name
    return f"{shown}:{f.lineno} {f.name}"


class Responder:
    """One rank's answer to a hang, ready from the run's start: its thread waits on `wake/R`; "hang" makes it
    write RUN/hang/rank-R.txt and put a short answer under `answer/R`; "exit" ends it (the run's end)."""

    def __init__(self, store: dist.Store, ctx: DistContext, out: Path):
        self.store, self.ctx, self.out = store, ctx, out
        self.main = threading.main_thread().ident
        self.thread = threading.Thread(target=self.serve, name="ddplab-hang-responder", daemon=True)
        self.thread.start()

    @classmethod
    def start(cls, ctx: DistContext, out: Path) -> Responder | None:
        if not ctx.is_distributed:
            return None
        store = side_store()
        return cls(store, ctx, out) if store is not None else None

    def serve(self) -> None:
        key = f"wake/{self.ctx.rank}"
        with contextlib.suppress(Exception):  # the store gone (a host lost, the run over): nothing to answer
            self.store.wait([key], timedelta(days=365))
            if self.store.get(key) == b"hang":
                self.store.set(f"answer/{self.ctx.rank}", json.dumps(self.answer()))

    def answer(self) -> dict:
        """Write this rank's stacks and record; the short answer the line is made of."""
        frames = sys._current_frames()
        main = frames.get(self.main) if self.main is not None else None
        records = self.ctx.collectives
        last = records.last()
        lines = [
            f"rank {self.ctx.rank} (pid {os.getpid()}) on {socket.gethostname()}, "
            f"{time.strftime('%Y-%m-%d %H:%M:%S')}: asked by the ranks whose collective timed out",
            "",
            "the last collectives it entered (ddplab's count; newest last):",
            *(f"  {records.describe(e)} at {time.strftime('%H:%M:%S', time.localtime(e.at))}" for e in records.entries),
            "",
        ]
        for thread in threading.enumerate():
            frame = frames.get(thread.ident) if thread.ident is not None else None
            if frame is None or thread is threading.current_thread():
                continue
            kind = "main" if thread.ident == self.main else "daemon" if thread.daemon else "other"
            lines.append(f"thread {thread.name} ({kind}):")
            lines += [line.rstrip("\n") for line in traceback.format_stack(frame)]
            lines.append("")
        folder = self.out / FOLDER
        path = folder / f"rank-{self.ctx.rank}.txt"
        with contextlib.suppress(OSError):
            folder.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join(lines) + "\n")
            flight_recorder(self.ctx, folder)
        return {
            "frame": where(main) if main is not None else None,
            "last_seq": last.seq if last is not None else 0,
            "last": records.describe(last) if last is not None else None,
        }

    def close(self) -> None:
        """The run's end: the thread ends (its wait is answered), never left blocked on the store. Over a
        connection of its own: the thread's is held by its wait."""
        if self.thread.is_alive():
            with contextlib.suppress(Exception):
                store = side_store(timeout_s=2.0)
                if store is not None and not store.check([f"wake/{self.ctx.rank}"]):
                    store.set(f"wake/{self.ctx.rank}", "exit")
        self.thread.join(timeout=1.0)


@contextlib.contextmanager
def responding(ctx: DistContext, out: Path):
    """A responder for the run's length (none for one process)."""
    responder = Responder.start(ctx, out)
    try:
        yield responder
    finally:
        if responder is not None:
            responder.close()


def flight_recorder(ctx: DistContext, folder: Path) -> None:
    """torch's own record of the collectives, where this torch keeps one (Gloo's and NCCL's on a recent torch,
    distributed.FLIGHT_RECORDER_ENTRIES): written beside ddplab's as rank-R.fr.pkl, which torch's
    `torch.distributed.flight_recorder` tools read. Elsewhere, ddplab's record is the one."""
    with contextlib.suppress(Exception):
        dump = internals.flight_recorder_dump()
        if dump:
            (folder / f"rank-{ctx.rank}.fr.pkl").write_bytes(dump)


def inquire(store: dist.Store | None, world_size: int, wait_s: float = ANSWER_WAIT_S) -> dict[int, dict | None]:
    """Wake every rank's responder and gather the answers that come within `wait_s` (None: no answer)."""
    if store is None:
        return {}
    answers: dict[int, dict | None] = dict.fromkeys(range(world_size))
    with contextlib.suppress(Exception):
        for rank in range(world_size):
            store.set(f"wake/{rank}", "hang") if not store.check([f"wake/{rank}"]) else None
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(a is None for a in answers.values()):
            for rank, found in answers.items():
                if found is None and store.check([f"answer/{rank}"]):
                    answers[rank] = json.loads(store.get(f"answer/{rank}"))
            time.sleep(0.05)
    return answers


def clause(answers: dict[int, dict | None], missing: list[int], ctx: DistContext, out: Path) -> str:
    """What the line adds for the ranks that never arrived: the collective the others wait in, and where each
    missing rank is, or that it did not answer; and where the stacks are. Empty where nobody was asked."""
    if not answers:
        return ""
    given = {r: a for r, a in answers.items() if a is not None}
    waited = max(given.values(), key=lambda a: a["last_seq"], default=None)
    parts = []
    for rank in missing:
        who = "it" if len(missing) == 1 else f"rank {rank}"
        mine = given.get(rank)
        if mine is None:
            parts.append(f"{who} did not answer (stopped, or its host cut off)")
            continue
        entered = (
            f"never entered {waited['last']}"
            if waited is not None and waited["last"] and mine["last_seq"] < waited["last_seq"]
            else f"entered every collective the others did (the last: {mine['last'] or 'none'}; they wait in one of "
            "torch's own, such as DDP's first bucket rebuild)"
        )
        parts.append(f"{who} {entered} and is in {mine['frame']}")
    stacks = f"; stacks in {out / FOLDER}/" + (" on each host" if len(set(ctx.hosts)) > 1 else "") if given else ""
    return ": " + "; ".join(parts) + stacks


def ask(ctx: DistContext) -> dict[int, dict | None]:
    """From a rank whose collective timed out: every rank's answer (engine/worker.collective_failure)."""
    return inquire(side_store(timeout_s=ANSWER_WAIT_S), ctx.world_size) if ctx.is_distributed else {}
