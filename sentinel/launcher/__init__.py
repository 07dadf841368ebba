"""`sentinel launch`: the local process executor that runs a job's ranks on this machine and carries out orders."""
