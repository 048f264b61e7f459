"""BCC C programs of slotscope, read with importlib.resources."""
