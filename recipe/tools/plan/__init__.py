"""The offline capacity planner: how to split GPUs between trainer and rollout.

inputs.py  Workload measured from a run directory (or given by flags)
verl.py    the same from a verl run's metrics
spec.py    Workload, Layout, SimResult: what is simulated and what comes out
sim.py     the discrete-event simulation (engines, trainer, pushes)
modes.py   each mode's trainer process, and simulate()
cli.py     python -m recipe.tools.plan: sweep the layouts, print the table, recommend one
"""
