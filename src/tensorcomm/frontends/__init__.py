"""Thin API layers: validate arguments, convert arrays through adapters, call the core."""
