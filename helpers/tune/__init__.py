"""Deciding: rounds and their ledger, the keep/reject rules, diagnosis, suggestions, the auto-tuner."""
