"""A memory-streaming neighbor: copies one buffer of MB into another, over and over, until it is
stopped (SIGTERM), as a data loader or another tenant's job streams memory on the cores beside a
service. Past the last level cache it takes that cache and the memory's bandwidth from the other
cores; it never touches their private caches. Prints "ready" once both buffers are written, and
on SIGTERM one line "neighbor mb=MB copies=N gb_per_s=R".

  taskset -c 8 python3 bench/workloads/memory_neighbor.py [--mb 512]
"""
import argparse
import signal
import sys
import time


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=int, default=512, help="each of the two buffers, in MB")
    args = p.parse_args()
    if args.mb < 1:
        p.error(f"--mb {args.mb}: expected at least 1")
    src = bytearray(b"\x5a") * (args.mb << 20)
    dst = bytearray(args.mb << 20)
    dst[:] = src  # every page of both buffers is touched before "ready"
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    print("ready", flush=True)
    copies, start = 0, time.monotonic()
    while not stop:
        dst[:] = src
        copies += 1
    seconds = max(time.monotonic() - start, 1e-9)
    print(f"neighbor mb={args.mb} copies={copies} "
          f"gb_per_s={copies * (args.mb << 20) / seconds / 1e9:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
