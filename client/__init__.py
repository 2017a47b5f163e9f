"""fedmomentum client package."""
