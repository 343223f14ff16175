"""Mixtures of experts: which experts a token goes to (routing.py) and their weighted sum (layer.py)."""
