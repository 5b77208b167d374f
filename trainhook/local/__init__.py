"""Local pods: run a manifest gang on one machine."""
