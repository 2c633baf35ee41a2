"""The sweep as files, below everything that runs or reads one: the sweep file (spec.py, and the sweeps ddplab
ships in bundled/) and the sweep folder with its manifest (folder.py). The report and the planner read these; the
sweep's executors (ddplab.sweep) write them. Like rundir/ for one run."""
