"""The report path from an agent's report to incidents, pages and remediation: report.py declares it."""
