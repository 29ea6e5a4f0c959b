"""CPU backend (Numba)."""
