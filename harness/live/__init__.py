"""The live drill: a run's figures served to Prometheus while it goes (:mod:`.metrics`),
promises judged from the history as it is written (:mod:`.online`), and stop conditions
(:mod:`.stop`) that end a drill before it hurts; :mod:`.view` ties them to a run."""
