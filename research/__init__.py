"""One-off probes and studies of the embedded testbed (not user entry points; see README.md)."""
