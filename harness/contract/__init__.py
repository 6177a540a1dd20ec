"""The system contract: what the verifier may know about a system (see docs/ARCHITECTURE.md)."""
