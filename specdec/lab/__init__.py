"""The lab: sweeps, their results store, tables, plots, reports and zoo quality figures."""
