"""How ddplab starts processes and where each one sits.

elastic.py starts a run, in this process or as N workers through PyTorch's elastic launcher; watchdog.py
bounds the waits the elastic agent does not keep across a network; topology.py says whether this process is
one worker of a launcher's group and where it sits; stops.py is the one stop-signal rule; process.py runs a
command as its own process tree; warm/ forks the processes ddplab starts from a server that imported torch
once; allreduce.py times all-reduce in the launcher's workers; hosts.py makes hosts with their own addresses
on one machine.

Each module is a layer of its own (tests/test_layers.py): the metrics read the process tree and the hosts,
and the engine reads the topology, while elastic.py starts the engine, so the package is a folder of modules,
not one layer.
"""
