#!/bin/sh
# The scenario job: run by the guest's PID 1 from the 9p share.
exec /opt/slotscope-venv/bin/python /job/guest/scenario.py
