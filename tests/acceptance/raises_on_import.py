"""A problem module whose own code fails at import (``tests.acceptance.raises_on_import:P``
in the bad-input table): loading it must give one line, not a traceback."""

raise RuntimeError("this module needs a GPU at import time")
