"""Checks a user runs by hand, ``python -m domino.tools.<name>``; the workflow never calls them."""
