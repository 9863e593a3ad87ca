"""Passes that add offload copies (``OFFLOAD``/``RELOAD``) to a compute order."""
