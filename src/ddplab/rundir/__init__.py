"""The run folder as a file format, in one place: its files by name (runfiles), what a folder may be used for
(runfolder), who holds it (runlock), a run prepared once before any process trains (runplan), its checkpoints
(checkpoint), and a folder read back (runread). A sweep folder is the sweep's (sweep/folder.py); the engine
makes the folder as a run starts (engine/rundir.py).

Each module is a layer of its own (tests/test_layers.py): the metrics read file names from runfiles and
runread reads the metrics' records, so the package is a folder of modules, not one layer."""
