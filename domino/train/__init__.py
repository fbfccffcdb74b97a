"""Training: the loop and validation, its rows and its optimizers (workflow/rules/train.smk)."""
