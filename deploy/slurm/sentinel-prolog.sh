#!/bin/sh
# Slurm Prolog (slurm.conf: Prolog=/etc/slurm/prolog.d/sentinel-prolog.sh). Exit 1 drains the node and
# requeues the job: see sentinel_node_check.py beside it.
exec /usr/bin/env python3 "$(dirname "$0")/sentinel_node_check.py" prolog
