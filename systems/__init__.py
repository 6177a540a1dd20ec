"""Systems under test other than the reference: each stands alone (imports nothing from the
harness, chaos, the emulators or the reference) and comes with its own driver and target file."""
