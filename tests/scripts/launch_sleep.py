"""Test rank: print 'ready' and sleep until stopped (Ctrl-C / lost-host tests)."""
import time

print("ready", flush=True)
while True:
    time.sleep(0.2)
