"""Collective algorithms: pure functions over ``Ctx``; one module per collective family."""
