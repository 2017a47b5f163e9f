"""fedmomentum theory package."""
