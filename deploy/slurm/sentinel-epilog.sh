#!/bin/sh
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/epilog.d/sentinel-epilog.sh). Exit 1 drains the node before
# the next job lands on it: see sentinel_node_check.py beside it.
exec /usr/bin/env python3 "$(dirname "$0")/sentinel_node_check.py" epilog
