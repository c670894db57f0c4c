"""A user's own package, outside the library: its methods reach the
binaries with `--method_module=mypkg.pull` (tests/train_binary_test.py)."""
