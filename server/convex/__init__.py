"""Convex objectives: the population optimum f* of model=logreg and the pop_gap column (docs/convex.md)."""
