"""A minimal stand-in for the `expecttest` package (used only if it is missing).

torch.testing._internal.common_utils imports `expecttest` and derives its
TestCase from `expecttest.TestCase`; the distributed suite never calls the
expect-inline assertions, so comparing strings is enough here. Install the
real package (`expecttest`, PyPI) to drop this shim.
"""

from __future__ import annotations

import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    """unittest.TestCase plus the two expecttest assertions, without rewriting."""

    longMessage = True

    def assertExpectedInline(  # noqa: N802 - expecttest's name
        self, actual: str, expect: str, skip: int = 0
    ) -> None:
        self.assertMultiLineEqual(expect, actual)

    def assertExpectedRaisesInline(  # noqa: N802 - expecttest's name
        self, exc_type: type[BaseException], callable_: object, expect: str,
        *args: object, **kwargs: object
    ) -> None:
        try:
            callable_(*args, **kwargs)  # type: ignore[operator]
        except exc_type as e:
            self.assertExpectedInline(str(e), expect)
            return
        self.fail(f"did not raise {exc_type.__name__}")
