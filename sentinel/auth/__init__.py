"""Auth."""
