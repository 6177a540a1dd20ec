"""harness/stack: see docs/ARCHITECTURE.md."""
