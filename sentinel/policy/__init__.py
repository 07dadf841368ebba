"""Policies that decide placement, the checkpoint interval and serving degradation: the heuristics and the
learned one. `features` turns a node's fault history into the state the learned policy reads, `hazard` is
the learned model (a logistic hazard over those features, weights in `learned.json`)."""
