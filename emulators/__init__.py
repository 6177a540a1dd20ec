"""emulators: see docs/ARCHITECTURE.md."""
