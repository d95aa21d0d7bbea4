"""Knob registry use, Optuna study, measurement, keep rule, config writer."""
