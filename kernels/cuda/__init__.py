"""CUDA backend (numba.cuda). Importing it needs no GPU; get_backend("cuda") checks for one."""
