"""Transports move bytes between ranks and know nothing of collectives."""
