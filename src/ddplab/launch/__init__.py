"""How ddplab starts processes.

elastic.py starts a run, in this process or as N workers through PyTorch's elastic launcher; watchdog.py
bounds the waits the elastic agent does not keep across a network; process.py runs a command as its own
process tree; warm/ forks the processes ddplab starts from a server that imported torch once; allreduce.py
times all-reduce in the launcher's workers; hosts.py makes hosts with their own addresses on one machine;
tracked.py attaches a finished run's report to its MLflow run. Where a process sits (ddplab/topology.py) and the
one stop-signal rule (ddplab/stops.py) sit below: the config, the engine, the metrics and the planner read them,
and they start nothing. One layer (tests/test_layers.py): above the engine and the report, below the sweep.
"""
