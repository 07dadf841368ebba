"""Dense feedback for a slow job: the step-time decomposition per rank (components.py), each job's baseline
and current diagnosis (engine.py), slowdown attribution to a layer with its evidence (attribution.py, with the
node signals of signals.py), and the experiment catalog that confirms or refutes it (experiments.py,
dispatch.py; the agent side is collectors/experiments.py). REST in api.py; the MCP tools in sentinel/mcp/."""
