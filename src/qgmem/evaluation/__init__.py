"""Measuring the product: retrieval and QA evaluation, the learning protocol, the bootstrap, data-set probes.

This package sits on top of the product, beside the command line: it imports the product packages and
nothing in the product imports it (``tests/test_layering.py`` checks that).
"""
