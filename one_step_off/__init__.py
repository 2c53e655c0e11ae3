"""The one-step-off recipe: batch k+1 generates while batch k trains (``one_step_off.trainer``)."""
