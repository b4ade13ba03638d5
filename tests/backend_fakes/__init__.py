"""Stand-ins for kernel libraries, for tests/test_backends.py: a dispatch registry shaped like FLA's
``fla.backends`` and a library that refuses a call in its own code. Written for these tests; no
library's code is copied."""
