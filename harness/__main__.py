import gc
import sys

from harness.cli import main

code = main()
# Everything is written and closed by now. Without this, the interpreter's exit ran several full
# collections over the run's objects (a read-side run: 250k) as it cleared modules: 2.1-2.4 s
# on a loaded 2-core machine, past the 5 s an interrupted run has to end in. Frozen objects are
# left out of those collections; they are still freed.
gc.freeze()
sys.exit(code)
