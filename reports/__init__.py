"""Report templates (Jinja) and their partials, shipped as package data."""
