"""Planning beyond the machine a run was measured on: what the links cost (links.py)."""
