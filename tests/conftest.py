"""Test set-up: quiet TensorFlow, and one local TFF worker for the session.

The worker is started by `tff_methods.runtime`, which also ends it when the
test process exits.
"""

from tff_methods import runtime

runtime.quiet()
runtime.set_local_execution_context(max_concurrent_clients=2)
