"""MLflow tracking: runs in the tracker a user already browses, without ever costing a run.

The run folder stays the source of truth; MLflow gets a copy. Where to: `--output.mlflow URI`, else
$MLFLOW_TRACKING_URI (as MLflow's own tools read it), else nowhere; `--output.mlflow off` turns it off
even when the variable is set. A SQLite store's relative path is made absolute once, so every process of
a sweep writes to one database whatever its working directory, and its artifacts go beside the database.

`Tracker` is the client every caller goes through: its first failed call (a server down, gone away, a
store it cannot open; a SQLite store's after a few tries: processes starting at once race it) is warned about
once, and it goes quiet, remembering why (summary.json's
`tracking` says it). HTTP retries and timeouts are cut from MLflow's defaults (7 retries with backoff,
120 s) to one try of at most `HTTP_TIMEOUT_S`, so a dead server costs seconds, not minutes.

Which MLflow run is whose is kept in files: RUN/mlflow.json names a run's (a resumed run continues it),
SWEEP/mlflow.json the sweep's parent run; a point of a sweep learns its parent and its axis values
from its environment (`POINT_ENV`, set by sweep/point.py). Torch-free; MLflow is imported only when
tracking is on.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shlex
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ddplab.errors import ConfigError
from ddplab.io import files

log = logging.getLogger("ddplab")

OFF = "off"
URI_ENV = "MLFLOW_TRACKING_URI"
EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"
EXPERIMENT = "ddplab"  # the experiment runs go to when $MLFLOW_EXPERIMENT_NAME names none
POINT_ENV = "DDPLAB_MLFLOW_POINT"  # JSON: the sweep's parent run id, the point's label and axis values
FILE = "mlflow.json"  # in a run folder and in a sweep folder: which MLflow run is theirs
PARENT_TAG = "mlflow.parentRunId"  # MLflow's own tag for a nested run
HTTP_TIMEOUT_S = 10
BATCH = 100  # MLflow takes at most 100 params or tags in one log_batch

T = TypeVar("T")


def tracking_uri(setting: str | None) -> str | None:
    """Where the run logs, or None: the setting, else $MLFLOW_TRACKING_URI; 'off' is None."""
    uri = setting if setting else os.environ.get(URI_ENV) or None
    return None if uri is None or uri == OFF else absolute(uri)


def absolute(uri: str) -> str:
    """A SQLite store's relative path made absolute (sqlite:///runs/m.db -> sqlite:////abs/runs/m.db)."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/") and uri != prefix + ":memory:":
        return prefix + str(Path(uri[len(prefix) :]).expanduser().absolute())
    return uri


def check_available(setting: str | None) -> None:
    """Before anything is spawned: asking for MLflow without it installed is one line. Only the variable
    set (no --output.mlflow) is a warning: that shell may be set up for another environment."""
    if tracking_uri(setting) is None or installed():
        return
    if setting and setting != OFF:
        raise ConfigError(
            f"output.mlflow={setting!r}: MLflow is not installed (pip install 'ddplab[mlflow]'), "
            "or leave --output.mlflow out"
        )
    if not _warned:
        _warned.append(True)
        log.warning(f"${URI_ENV} is set but MLflow is not installed: no run is tracked (pip install 'ddplab[mlflow]')")


_warned: list[bool] = []  # the variable without MLflow is said once a process


def installed() -> bool:
    return importlib.util.find_spec("mlflow") is not None


def redacted(uri: str) -> str:
    """The URI without a password (http://user:secret@host -> http://user:***@host), for logs and files."""
    scheme, sep, rest = uri.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return uri
    credentials, host = rest.split("@", 1)
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in credentials else uri


# A SQLite store is shared by processes that start at once (two sweeps, a sweep's points): its creation and its
# writes race ("database is locked", a table made twice, an experiment created by the other). Such an error is
# transient: the call is tried again after each of these waits before the store is given up on. A server's error
# is not (a dead server must cost seconds): one try.
LOCAL_STORE_WAITS_S = (0.2, 0.5, 1.0, 2.0)


class Tracker:
    """An MLflow client that fails once: after its first error (a SQLite store's, after a few tries) every call
    is skipped and returns None."""

    def __init__(self, uri: str, what: str = "this run"):
        self.uri = uri
        self.what = what
        self.error: str | None = None
        self._client: Any = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def call(self, doing: str, action: Callable[[Any], T]) -> T | None:
        if self.error is not None:
            return None
        waits = LOCAL_STORE_WAITS_S if self.uri.startswith("sqlite:") else ()
        for wait_s in (*waits, None):
            try:
                if self._client is None:
                    self._client = connect(self.uri)
                return action(self._client)
            except Exception as exc:  # the tracker never costs a run: whatever it raises is reported, once
                if wait_s is None:
                    self.failed(doing, exc)
                    return None
                self._client = None  # a store met half-made: connect again
                time.sleep(wait_s)
        return None

    def failed(self, doing: str, exc: Exception) -> None:
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        self.error = f"{doing}: {type(exc).__name__}" + (f": {first}" if first else "")
        log.warning(
            f"MLflow at {redacted(self.uri)} failed ({self.error}); {self.what} goes on untracked, "
            "and its summary says so"
        )

    def experiment_id(self) -> str | None:
        name = os.environ.get(EXPERIMENT_ENV) or EXPERIMENT

        def find_or_create(client: Any) -> str:
            found = client.get_experiment_by_name(name)
            if found is not None:
                return found.experiment_id
            return client.create_experiment(name, artifact_location=artifact_location(self.uri))

        return self.call(f"opening experiment {name!r}", find_or_create)

    def start(self, ids: RunIds | None, experiment_id: str | None, name: str, tags: dict[str, str]) -> RunIds | None:
        """The run `ids` names, marked running again (a resume), or a new one in the experiment."""
        if ids is not None and ids.uri == self.uri:
            self.call("continuing its run", lambda c: c.update_run(ids.run_id, status="RUNNING"))
            return ids if self.ok else None
        if experiment_id is None:
            experiment_id = self.experiment_id()
        if experiment_id is None:
            return None
        run = self.call("creating its run", lambda c: c.create_run(experiment_id, run_name=name, tags=tags))
        return None if run is None else RunIds(self.uri, run.info.run_id, experiment_id)

    def log(
        self,
        run_id: str,
        *,
        params: dict[str, str] | None = None,
        metrics: Iterable[tuple[str, float, int]] = (),
        tags: dict[str, str] | None = None,
    ) -> None:
        """Params, tags and (name, value, step) metrics, in batches of what MLflow takes at once."""
        if not self.ok:
            return
        from mlflow.entities import Metric, Param, RunTag

        now = int(time.time() * 1000)
        batch_metrics = [Metric(k, float(v), now, step) for k, v, step in metrics]
        batch_params = [Param(k, v[:6000]) for k, v in (params or {}).items()]
        batch_tags = [RunTag(k, v) for k, v in (tags or {}).items()]
        for i in range(0, max(len(batch_params), len(batch_tags), len(batch_metrics), 1), BATCH):

            def log_batch(client: Any, i: int = i) -> None:
                client.log_batch(
                    run_id,
                    metrics=batch_metrics[i : i + BATCH],
                    params=batch_params[i : i + BATCH],
                    tags=batch_tags[i : i + BATCH],
                )

            self.call("logging", log_batch)

    def artifacts(self, run_id: str, paths: Iterable[Path], under: str | None = None) -> None:
        for path in paths:

            def upload(client: Any, path: Path = path) -> None:
                if path.is_dir():  # under its own name unless `under` names another
                    client.log_artifacts(run_id, str(path), under or path.name)
                else:
                    client.log_artifact(run_id, str(path), under)

            if path.exists():
                self.call(f"uploading {path.name}", upload)

    def end(self, run_id: str, status: str) -> None:
        def terminate(client: Any) -> None:
            client.set_terminated(run_id, status=status)

        self.call(f"ending its run as {status}", terminate)

    def state(self, ids: RunIds | None) -> dict[str, Any]:
        """What summary.json records: where, which run, and whether everything reached it."""
        return {
            "uri": redacted(self.uri),
            "run_id": ids.run_id if ids else None,
            "logged": self.ok and ids is not None,
            "error": self.error,
        }


def connect(uri: str) -> Any:
    # One try, bounded: MLflow reads these when it makes each request; the user's own settings win.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(HTTP_TIMEOUT_S))
    if uri.startswith("sqlite:///"):
        files.make_dir(Path(uri[len("sqlite:///") :]).parent)
    from mlflow.tracking import MlflowClient

    # After the import, which sets MLflow's own levels: a new database's schema migrations log at INFO.
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    return MlflowClient(tracking_uri=uri)


def artifact_location(uri: str) -> str | None:
    """A SQLite store keeps artifacts in a folder beside its database (MLflow's default is ./mlruns of
    whatever the working directory is); a server or another store decides for itself."""
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///") :]).parent / "mlflow-artifacts").as_uri()
    return None


@dataclass(frozen=True)
class RunIds:
    """Which MLflow run a folder's is, kept in its mlflow.json."""

    uri: str
    run_id: str
    experiment_id: str

    @classmethod
    def read(cls, folder: Path) -> RunIds | None:
        try:
            data = json.loads((folder / FILE).read_text())
            ids = cls(data["uri"], data["run_id"], data["experiment_id"])
        except (OSError, ValueError, KeyError, TypeError):
            return None  # none yet, or unreadable: a new run is made
        return ids if all(isinstance(v, str) for v in (ids.uri, ids.run_id, ids.experiment_id)) else None

    def write(self, folder: Path) -> None:
        files.write_json(folder / FILE, {"uri": self.uri, "run_id": self.run_id, "experiment_id": self.experiment_id})


@dataclass(frozen=True)
class PointLink:
    """What a sweep's point passes to its run: the parent run and the point's label and axis values."""

    uri: str  # the parent's store: a point's run logged elsewhere is not its child
    parent_run_id: str
    experiment_id: str
    label: str
    axes: dict[str, str]

    def env(self) -> dict[str, str]:
        return {POINT_ENV: json.dumps(self.__dict__)}

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> PointLink | None:
        text = (os.environ if env is None else env).get(POINT_ENV)
        if not text:
            return None
        try:
            return cls(**json.loads(text))
        except (ValueError, TypeError):
            log.warning(f"${POINT_ENV} is not what a ddplab sweep sets; the run is tracked on its own")
            return None

    @classmethod
    def under(cls, parent: RunIds, label: str, axes: dict[str, str]) -> PointLink:
        """The link a point's run gets under its tracked sweep's run (SWEEP/mlflow.json's ids)."""
        return cls(parent.uri, parent.run_id, parent.experiment_id, label, axes)

    def params(self) -> dict[str, str]:
        return {"sweep.point": self.label, **{f"sweep.axis.{k}": v for k, v in self.axes.items()}}


class SweepTracking:
    """A sweep as a parent run: made (or continued) before its points start, its report attached and
    its status set once they ended."""

    def __init__(self, uri: str, sweep_dir: Path):
        self.tracker = Tracker(uri, what="the sweep")
        self.sweep_dir = sweep_dir
        self.ids: RunIds | None = None

    def start(self, name: str, params: dict[str, str]) -> None:
        earlier = RunIds.read(self.sweep_dir)
        self.ids = self.tracker.start(earlier, None, name, {"ddplab.kind": "sweep"})
        if self.ids is not None:
            files.make_dir(self.sweep_dir)
            self.ids.write(self.sweep_dir)
            if self.ids != earlier:
                self.tracker.log(self.ids.run_id, params=params)
            print(
                f"MLflow: the sweep is run {self.ids.run_id} at {redacted(self.tracker.uri)}, each point a child of it"
                + (
                    f" (to browse: mlflow ui --backend-store-uri {shlex.quote(self.tracker.uri)})"
                    if self.tracker.uri.startswith("sqlite:")
                    else ""
                ),
                flush=True,
            )

    def end(self, paths: Iterable[Path], finished: bool) -> None:
        if self.ids is None:
            return
        self.tracker.artifacts(self.ids.run_id, paths)
        self.tracker.end(self.ids.run_id, "FINISHED" if finished else "FAILED")

    def stopped(self, error: BaseException) -> None:
        """The sweep command ended before its points did (Ctrl-C, a refusal): a re-run continues the run."""
        if self.ids is not None:
            self.tracker.end(self.ids.run_id, "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED")
