"""Property-test plumbing: each test body calls ``prop_helpers.count("ClassName")`` once per
generated case; the root ``tests/conftest.py`` prints the table at the end of the session (summed
over xdist workers) and, when ``GPUPROMPT_PROPERTY_REPORT`` names a file, writes it there as JSON::

    {"cases": {"VectorIndex": 1234, ...}, "total": 5678}
"""
