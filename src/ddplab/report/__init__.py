"""Reports made from run folders only (never from live processes), so any runs can be compared."""
