"""The README's picture of MLflow's UI: `mlflow ui` on a tracked store, a sweep's points side by side (Chromium).

    python scripts/mlflow_screenshot.py runs/mlflow.db docs/mlflow-ui.png [--experiment ddplab]

Starts the UI on a free loopback port (its job runner off), waits for /health, opens MLflow's compare page on the
newest sweep's points (children of its run; the page's URL names the runs, so nothing needs a click), takes a
screenshot (1600x1000 by default), and stops the UI.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", type=Path, help="the SQLite store (--output.mlflow sqlite:///DB)")
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--experiment", default="ddplab")
    parser.add_argument("--wait-ms", type=int, default=20000, help="virtual time the page gets to render")
    parser.add_argument("--size", default="1600,1000", help="the window, WIDTH,HEIGHT")

    args = parser.parse_args()
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{args.db.resolve()}"
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(args.experiment)
    if experiment is None:
        sys.exit(f"{args.db} has no experiment {args.experiment!r}")
    # The newest sweep's points, side by side on MLflow's compare page (its URL says everything it shows).
    sweeps = client.search_runs([experiment.experiment_id], "tags.`ddplab.kind` = 'sweep'", max_results=1)
    if not sweeps:
        sys.exit(f"{args.db} holds no ddplab sweep in {args.experiment!r}")
    parent = sweeps[0].info.run_id
    points = client.search_runs([experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'")
    ids = json.dumps([r.info.run_id for r in sorted(points, key=lambda r: r.info.start_time)])
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("no chromium on PATH (apt-get install chromium)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ui = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )
    try:
        deadline = time.monotonic() + 120
        while not healthy(port):
            if ui.poll() is not None or time.monotonic() > deadline:
                sys.exit("mlflow ui did not start")
            time.sleep(0.3)
        with tempfile.TemporaryDirectory() as profile:
            subprocess.run(
                [chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
                 "--hide-scrollbars", f"--window-size={args.size}", f"--virtual-time-budget={args.wait_ms}",
                 f"--screenshot={args.out.resolve()}",
                 f"http://127.0.0.1:{port}/#/compare-runs?"
                 + urllib.parse.urlencode({"runs": ids, "experiments": json.dumps([experiment.experiment_id])})],
                check=True, capture_output=True, timeout=300,
            )  # fmt: skip
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
        ui.wait(timeout=30)
    print(f"{args.out}: MLflow's UI over {args.db}, experiment {args.experiment!r}")
    return 0


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


if __name__ == "__main__":
    raise SystemExit(main())
