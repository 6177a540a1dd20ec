"""harness/load: see docs/ARCHITECTURE.md."""
