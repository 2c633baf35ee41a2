"""ddplab's borders with files and other programs: the kinds of value it accepts from a file it did not just
write or from another program (borders.py), the kinds a command-line option takes (arguments.py), and every
file it writes, atomically (files.py). Torch-free, below everything else but errors.py.
"""
