"""Test spine: dynamic providers driven as the engine does (engine), programs under mocks (program)."""
