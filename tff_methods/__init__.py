"""tff_methods: federated learning on non-IID data as TFF learning processes.

Importing the package sets nothing up in the importing process. One hook
only: at exit, TFF's import-time default context (if TFF was imported) is
dropped while Python still runs, so that its `ServiceManager.__del__` does
not print a traceback at interpreter shutdown (TFF 0.87's does).
"""

import atexit as _atexit
import sys as _sys


def _drop_tffs_import_time_context() -> None:
  if 'tensorflow_federated' not in _sys.modules:
    return
  try:
    from tensorflow_federated.python.core.impl.context_stack import (
      context_stack_impl,
    )
    from tensorflow_federated.python.core.impl.context_stack import (
      runtime_error_context,
    )

    context_stack_impl.context_stack.set_default_context(
      runtime_error_context.RuntimeErrorContext()
    )
  except Exception:
    pass  # Exiting: nothing to do about a TFF that can't be reached.


_atexit.register(_drop_tffs_import_time_context)
