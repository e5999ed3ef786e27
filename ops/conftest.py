"""An op's own tests (ops/<name>/test_*.py) get what the project's tests have: tests/helpers.py importable, and the
fixtures of tests/conftest.py (the declarations, the builds, the registered ops). Its hooks (the test order and
--quick) are the project's, registered once by tests/conftest.py itself."""

import importlib.util
import os
import sys

_TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
sys.path.insert(0, _TESTS)
_spec = importlib.util.spec_from_file_location("project_test_fixtures", os.path.join(_TESTS, "conftest.py"))
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)
globals().update({name: value for name, value in vars(_fixtures).items()
                  if not name.startswith(("_", "pytest_")) and name not in globals()})
