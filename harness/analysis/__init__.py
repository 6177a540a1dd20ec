"""harness/analysis: see docs/ARCHITECTURE.md."""
