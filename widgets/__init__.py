"""ipywidgets panels over kit: each builds controls, calls kit, and redraws an altair chart."""
