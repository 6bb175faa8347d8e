"""Showing: tables, plots, widgets, studies for the notebooks, the planner, and the notebook runner + HTML index."""
