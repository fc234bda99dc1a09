"""Test rank: rank 1 raises first, but a non-daemon thread keeps its process alive a while, so
rank 0's later failure (exit 5) is REPORTED first. The root cause must still be rank 1."""
import os
import sys
import threading
import time

out = sys.argv[1]
flag = os.path.join(out, "rank1_raised")
if os.environ["RANK"] == "1":
    threading.Thread(target=time.sleep, args=(3,)).start()  # delays the exit, not the raise
    open(flag, "w").close()
    raise RuntimeError("the real root cause")
while not os.path.exists(flag):
    time.sleep(0.01)
time.sleep(0.05)
print("rank 0 giving up after its peer died", flush=True)
sys.exit(5)
