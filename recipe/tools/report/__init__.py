"""Reports of finished runs: plots, a Gantt chart of the pipeline and report.md.

data.py      RunData: a run directory (summary, metrics, trace, config) loaded
plotting.py  the curve plots (several runs overlaid)
gantt.py     the pipeline timeline of a few steps, from trace.json
cli.py       python -m recipe.tools.report: write the PNGs and report.md
"""
