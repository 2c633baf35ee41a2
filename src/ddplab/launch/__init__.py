"""How ddplab starts processes.

elastic.py starts a run, in this process or as N workers through PyTorch's elastic launcher; watchdog.py
bounds the waits the elastic agent does not keep across a network; process.py runs a command as its own
process tree; warm/ forks the processes ddplab starts from a server that imported torch once; allreduce.py
times all-reduce in the launcher's workers; hosts.py makes hosts with their own addresses on one machine.
Where a process sits (ddplab/topology.py) and the one stop-signal rule (ddplab/stops.py) sit below: the
config, the engine, the metrics and the planner read them, and they start nothing.

Each module is a layer of its own (tests/test_layers.py): the metrics read the process tree and the hosts,
while elastic.py starts the engine, so the package is a folder of modules, not one layer.
"""
