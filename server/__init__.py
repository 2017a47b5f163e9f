"""fedmomentum server package."""
