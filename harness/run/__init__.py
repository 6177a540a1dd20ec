"""harness/run: see docs/ARCHITECTURE.md."""
