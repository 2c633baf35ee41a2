"""The Slurm executor's own rules, without a cluster: batch scripts, allocation shapes, each point's status."""

import json
import os
import subprocess

import pytest

from ddplab.config import build_config
from ddplab.errors import ConfigError
from ddplab.sweep.slurm import SlurmExecutor, SlurmOptions, allocated_threads, allocation, batch_script, main
from ddplab.sweepdir.folder import Manifest, SweepFolder
from ddplab.sweepdir.spec import SweepRun

from support.runs import write_run


def run(strategy="single", nproc=1, nnodes=1):
    config = build_config(
        {"train": {"device": "cpu"}, "dist": {"strategy": strategy, "nproc": nproc, "nnodes": nnodes}}
    )
    return SweepRun("r", {}, 0, config)


def test_a_point_with_several_worker_processes_gets_them_all_in_its_allocation():
    assert allocation(run().config) == (1, 1)
    assert allocation(run("ddp", nproc=4).config) == (1, 4)
    assert allocation(run("ddp", nproc=2, nnodes=3).config) == (3, 2)
    assert allocation(run("ddp", nproc=1).config) == (1, 1)


def test_the_batch_script_runs_one_point_per_array_task_named_in_the_script(tmp_path):
    script = batch_script(tmp_path, "ddplab-s-1x2", ["a", "b-2", "c"], 1, 2, SlurmOptions(parallel=2))
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash" and "#SBATCH --array=0-2%2" in lines and "#SBATCH --ntasks-per-node=2" in lines
    assert "RUNS=(a b-2 c)" in lines  # Slurm keeps the script as submitted: a later submission changes nothing
    assert lines[-1].startswith("exec ") and lines[-1].endswith(
        f'-m ddplab.sweep.slurm task {tmp_path} "${{RUNS[$SLURM_ARRAY_TASK_ID]}}"'
    )
    assert "%" not in batch_script(tmp_path, "x", ["a"], 1, 1, SlurmOptions()).split("--array=")[1].splitlines()[0]
    ran = subprocess.run(
        ["bash", "-c", script.replace("exec ", "echo ") + "\n"],
        capture_output=True,
        text=True,
        env={**os.environ, "SLURM_ARRAY_TASK_ID": "1"},
    )
    assert ran.stdout.split()[-1] == "b-2"  # what bash makes of it: the task's own run


def test_slurm_options_become_sbatch_options():
    options = SlurmOptions(
        partition="gpu", account="lab", time="1:00:00", gpus_per_node=4, extra="--mem=16G --qos 'a b'"
    )
    assert options.sbatch_options() == [
        "--partition=gpu",
        "--account=lab",
        "--time=1:00:00",
        "--gpus-per-node=4",
        "--mem=16G",
        "--qos",
        "a b",
    ]
    with pytest.raises(ConfigError, match="cannot be split"):
        SlurmOptions(extra="--mem='1G").sbatch_options()


def test_each_submitted_point_takes_its_status_from_its_folder_its_outcome_and_the_queue(tmp_path):
    write_run(tmp_path / "runs" / "done")
    (tmp_path / "slurm").mkdir()
    for name, code, error in (("stopped", 130, "interrupted"), ("broken", 4, "training diverged")):
        (tmp_path / "slurm" / f"{name}.json").write_text(json.dumps({"exit_code": code, "error": error, "wall_s": 3.0}))
    names = ["done", "stopped", "broken", "waiting", "training", "vanished"]
    manifest = Manifest.from_json(
        {
            "name": "s",
            "runs": [
                {"name": n, "dir": f"runs/{n}", "status": "submitted", "job": f"9_{i}"} for i, n in enumerate(names)
            ],
        }
    )
    SlurmExecutor.update(SweepFolder(tmp_path), manifest, {"9_3": "PENDING", "9_4": "RUNNING"})
    got = {e.name: (e.status.value, e.exit_code) for e in manifest.runs}
    assert got == {
        "done": ("finished", 0),
        "stopped": ("interrupted", 130),
        "broken": ("failed", 4),
        "waiting": ("queued", None),
        "training": ("running", None),
        "vanished": ("failed", None),
    }
    vanished = manifest.runs[-1].error
    assert vanished.startswith("its task (job 9_5) ended without an outcome") and "slurm-9_5.out" in vanished
    SweepFolder(tmp_path).write(manifest)
    assert SweepFolder(tmp_path).load() == manifest  # the typed manifest reads back as written


def test_the_task_entry_point_says_how_it_is_called(capsys):
    assert main(["task", "out"]) == 2
    assert "usage: python -m ddplab.sweep.slurm task SWEEP_FOLDER RUN_NAME" in capsys.readouterr().err
    assert main(["task", "out", ""]) == 2  # an array task past the end of its RUNS
    assert main(["task", "out", "b-2"], run=lambda out, name: len(name)) == 3


def test_a_points_threads_follow_the_cpus_slurm_allocated():
    assert allocated_threads({"SLURM_CPUS_ON_NODE": "1"}, 1) == {"OMP_NUM_THREADS": "1"}
    assert allocated_threads({"SLURM_CPUS_ON_NODE": "8"}, 2) == {"OMP_NUM_THREADS": "4"}
    assert allocated_threads({"SLURM_CPUS_ON_NODE": "8", "SLURM_CPUS_PER_TASK": "3"}, 2) == {"OMP_NUM_THREADS": "3"}
    assert allocated_threads({"SLURM_CPUS_ON_NODE": "8", "OMP_NUM_THREADS": "2"}, 1) == {}  # the user's choice stands
    assert allocated_threads({}, 1) == {}


def test_status_says_a_run_whose_local_sweep_was_killed_is_stopped_not_running(tmp_path):
    from ddplab.sweep.executor import status

    write_run(tmp_path / "runs" / "done")
    (tmp_path / "manifest.json").write_text(
        json.dumps(
            {
                "name": "s",
                "runs": [
                    {"name": "done", "dir": "runs/done", "status": "finished"},
                    {"name": "mid", "dir": "runs/mid", "status": "running"},
                ],
            }
        )
    )  # its sweep was SIGKILLed: no lock holder
    lines = status(SweepFolder(tmp_path))
    assert lines[0] == "sweep s: 1 finished, 1 stopped" and lines[2].split()[:2] == ["mid", "stopped"]


def fake_tool(monkeypatch, answer: str):
    """Slurm's tools answering `answer` (exit 0) to whatever they are asked."""
    from ddplab.sweep import slurm

    monkeypatch.setattr(slurm, "slurm_tool", lambda args, what: answer)


@pytest.mark.parametrize(
    "answer, job", [("4242\n", "4242"), ("4242;cluster-a\n", "4242"), ("sbatch: note: using account x\n4243\n", "4243")]
)
def test_sbatch_s_answer_is_read_as_a_job_id(monkeypatch, tmp_path, answer, job):
    from ddplab.sweep.slurm import sbatch

    fake_tool(monkeypatch, answer)
    assert sbatch(tmp_path / "a.sbatch", []) == job


@pytest.mark.parametrize(
    "answer", ["<html><body>502 Bad Gateway</body></html>", "", "Submitted batch job 12", "12;", "-5"]
)
def test_an_sbatch_answer_that_is_not_a_job_id_is_never_recorded_as_one(monkeypatch, tmp_path, answer):
    from ddplab.sweep.slurm import sbatch

    fake_tool(monkeypatch, answer)
    with pytest.raises(
        ConfigError,
        match=r"^sbatch answered .*, not a job id \(JOB or JOB;CLUSTER\): a\.sbatch may or "
        r"may not be queued; see squeue before submitting again$",
    ):
        sbatch(tmp_path / "a.sbatch", [])


def test_squeue_s_answer_is_read_line_by_line_and_one_that_is_not_a_queue_is_refused(monkeypatch):
    from ddplab.sweep.slurm import queued_jobs

    fake_tool(monkeypatch, "9_0|RUNNING\n9_1|PENDING\n8_0|RUNNING\n\n")
    ninth = Manifest(name="s", runs=[], jobs=["9"])
    assert queued_jobs(ninth) == {"9_0": "RUNNING", "9_1": "PENDING"}
    fake_tool(monkeypatch, "")
    assert queued_jobs(ninth) == {}  # nothing queued
    for garbage in ("<html>maintenance</html>", "JOBID|STATE"):
        fake_tool(monkeypatch, garbage)
        with pytest.raises(ConfigError, match="squeue answered .*, not lines of JOB_TASK|STATE"):
            queued_jobs(ninth)


def test_a_slurm_tool_answering_bytes_that_are_not_utf8_is_one_line(monkeypatch, tmp_path):
    """squeue answering bytes that are not UTF-8 (a site's wrapper, a locale) was a UnicodeDecodeError traceback."""
    from ddplab.sweep.slurm import queued_jobs

    tool = tmp_path / "squeue"
    tool.write_text("#!/bin/sh\nprintf '9_0|RUNNING\\n\\377\\376 maintenance\\n'\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert queued_jobs(Manifest(name="s", runs=[], jobs=["9"])) == {"9_0": "RUNNING"}  # the lines it can read
    tool.write_text("#!/bin/sh\nprintf '\\377\\376 maintenance\\n'\n")
    with pytest.raises(ConfigError, match="squeue answered .*, not lines of JOB_TASK|STATE"):
        queued_jobs(Manifest(name="s", runs=[], jobs=["9"]))


@pytest.mark.parametrize(
    "outcome",
    [
        '{"exit_code": "4"}',
        '{"error": "x"}',
        "[]",
        '{"exit_code": 4, "wall_s": NaN}',
        '{"exit_code": 4',
        '{"exit_code": 1e400}',
    ],
    ids=["text-code", "no-code", "not-an-object", "nan-wall", "cut-short", "overflow"],
)
def test_a_task_outcome_that_is_not_what_the_task_writes_is_its_failure_naming_the_file(tmp_path, outcome):
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "r.json").write_text(outcome)
    manifest = Manifest.from_json(
        {"name": "s", "runs": [{"name": "r", "dir": "runs/r", "status": "submitted", "job": "9_0"}]}
    )
    SlurmExecutor.update(SweepFolder(tmp_path), manifest, {})
    entry = manifest.runs[0]
    assert entry.status == "failed" and entry.exit_code is None
    assert entry.error.startswith(f"its outcome cannot be read: {tmp_path / 'slurm' / 'r.json'}")


@pytest.mark.parametrize(
    "options, gpus",
    [
        (SlurmOptions(gpus_per_node=1), True),
        (SlurmOptions(), False),
        (SlurmOptions(extra="--gres=gpu:a100:2 --mem=8G"), True),
        (SlurmOptions(extra="--gpus=4"), True),
        (SlurmOptions(extra="--mem=8G"), False),
    ],
)
def test_a_slurm_sweep_takes_its_default_profile_from_the_nodes_it_asks_for_not_this_machine(
    options, gpus, tmp_path, capsys
):
    """From a CPU login node, a sweep whose tasks ask for GPUs runs its gpu profile (it ran the cpu one: a small
    subset for 2 epochs, on GPU nodes, without a word), and says so."""
    from ddplab.cli import main as ddplab
    from ddplab.sweepdir.spec import load_sweep, sweep_file

    sweep = load_sweep(sweep_file("assignment"), on_gpus=options.asks_gpus())
    assert options.asks_gpus() is gpus and sweep.profile == ("gpu" if gpus else "cpu")
    argv = ["sweep", "assignment", "--executor", "slurm", "--dry-run", "--out", str(tmp_path / "s")]
    if options.gpus_per_node:
        argv += ["--slurm.gpus-per-node", str(options.gpus_per_node)]
    if options.extra:
        argv += [f"--slurm.extra={options.extra}"]
    assert ddplab(argv) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"sweep assignment: profile {'gpu' if gpus else 'cpu'}, as its points ask slurm for")


def test_a_slurm_dry_run_into_a_run_folder_is_refused_as_a_submission_is(tmp_path):
    from ddplab.sweepdir.spec import load_sweep, sweep_file

    write_run(tmp_path / "run")
    with pytest.raises(ConfigError, match=r"is a run folder, not a sweep folder"):
        SlurmExecutor().dry_run(load_sweep(sweep_file("assignment")), SweepFolder(tmp_path / "run"))


def test_waiting_for_a_sweep_whose_submission_was_refused_says_nothing_was_submitted(tmp_path):
    """`sweep --wait` after a refused sbatch said "2 of 2 runs did not finish ... run the sweep again": nothing
    was ever submitted, and nothing is waited for."""
    manifest = Manifest.from_json(
        {"name": "s", "executor": "slurm", "runs": [{"name": n, "dir": f"runs/{n}", "status": "pending"} for n in "ab"]}
    )
    SweepFolder(tmp_path).write(manifest)
    with pytest.raises(ConfigError, match=r"^no point of .* was submitted to Slurm \(its submission was refused"):
        SlurmExecutor().wait(SweepFolder(tmp_path))
