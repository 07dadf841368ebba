"""The network tier: the probe-mesh matrix and its localisation, RDMA port counters and their rules, and the
collective-timing verdict that tells a slow link from a slow rank (DESIGN §9)."""
