"""Hypothesis strategies (``strategies``) and named GDN properties (``checks``)."""
