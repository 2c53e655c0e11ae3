"""The offline capacity planner: how to split GPUs between trainer and rollout.

inputs.py  Workload measured from a run directory (or given by flags)
decode.py  an engine's two decode speeds (a lone sequence's, a full engine's) from a sync run
verl.py    the same from a verl run's metrics
spec.py    Workload, Layout, SimResult: what is simulated and what comes out
sim.py     the discrete-event simulation (engines, trainer, pushes)
modes.py   each mode's trainer process, and simulate()
cli.py     python -m recipe.tools.plan: sweep the layouts, print the table, recommend one
"""
