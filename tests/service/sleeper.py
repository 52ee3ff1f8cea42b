"""A stand-in engine child for test_recovery.py: sets itself up as the real ones do, says so, sleeps."""

import time

from job_host.sandbox import limit_self

if __name__ == "__main__":
    limit_self()
    print("ready", flush=True)
    time.sleep(60)
