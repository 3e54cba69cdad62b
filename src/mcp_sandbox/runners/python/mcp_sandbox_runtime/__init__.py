"""The runtime inside a Python sandbox: the frame protocol and the runner. Stdlib only."""
