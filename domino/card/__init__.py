"""The model card: its tables, plots, scale statement, published figures, templates and the report stage.

It reads results files, never models."""
