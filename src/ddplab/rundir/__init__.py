"""The run folder as a file format, in one place: its files by name (runfiles), what a folder may be used for
(runfolder), who holds it (runlock), a run prepared once before any process trains (runplan), its checkpoints
(checkpoint), and a folder read back (runread). A sweep folder is the sweep's (sweepdir/folder.py); the engine
makes the folder as a run starts (engine/makedir.py).

Also what the run folder's two main files hold, declared once: summary.json (summary.py) and metrics.jsonl's epoch
records (epochs.py). One layer (tests/test_layers.py), below the metrics, the engine and every reader."""
