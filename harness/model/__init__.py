"""harness/model: see docs/ARCHITECTURE.md."""
