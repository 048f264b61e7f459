"""Reads captures and turns them into findings. Never imports bcc or textual."""
