"""Hardware event counters of the calling thread (perf_event_open, user mode only), for CPU cost
figures that the host's clock and frequency noise cannot hide: instructions retired count the
work itself, whatever the core's speed.

  c = ThreadCounters()          # None-valued fields where the kernel or the machine says no
  before = c.read(); ...; after = c.read()   # {"instructions": n, "cycles": n}

`python3 bench/perf_counter.py` says whether this machine counts (perf_event_paranoid, a PMU in
a virtual machine) and what a fixed loop reads.
"""
import ctypes
import os
import struct
import sys

_NR_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}.get(os.uname().machine)
_PERF_TYPE_HARDWARE = 0
_EVENTS = {"cycles": 0, "instructions": 1}
_ATTR_SIZE = 112  # PERF_ATTR_SIZE_VER5


def _open(config):
    if _NR_PERF_EVENT_OPEN is None:
        return -1, "unsupported architecture"
    # struct perf_event_attr: type, size, config, sample_period, sample_type, read_format, flags
    # (disabled=0; exclude_kernel bit 5, exclude_hv bit 6), the rest zero.
    flags = (1 << 5) | (1 << 6)
    attr = struct.pack("IIQQQQQ", _PERF_TYPE_HARDWARE, _ATTR_SIZE, config, 0, 0, 0, flags)
    attr += b"\0" * (_ATTR_SIZE - len(attr))
    buf = ctypes.create_string_buffer(attr, _ATTR_SIZE)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    fd = libc.syscall(ctypes.c_long(_NR_PERF_EVENT_OPEN), buf, ctypes.c_int(0), ctypes.c_int(-1),
                      ctypes.c_int(-1), ctypes.c_ulong(0))
    if fd < 0:
        return -1, os.strerror(ctypes.get_errno())
    return fd, None


class ThreadCounters:
    """The calling thread's user-mode instructions and cycles since this object was made."""

    def __init__(self):
        self.fds, self.errors = {}, {}
        for name, config in _EVENTS.items():
            fd, err = _open(config)
            if fd >= 0:
                self.fds[name] = fd
            else:
                self.errors[name] = err

    def read(self):
        return {name: struct.unpack("Q", os.read(fd, 8))[0] if fd is not None else None
                for name, fd in ((n, self.fds.get(n)) for n in _EVENTS)}

    def close(self):
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}


def main():
    try:
        paranoid = open("/proc/sys/kernel/perf_event_paranoid").read().strip()
    except OSError:
        paranoid = "?"
    c = ThreadCounters()
    before = c.read()
    x = 0
    for i in range(100000):
        x += i
    after = c.read()
    print(f"perf_event_paranoid={paranoid} errors={c.errors} "
          + " ".join(f"{k}={(after[k] - before[k]) if after[k] is not None else None}"
                     for k in after))
    sys.exit(0 if c.fds else 1)


if __name__ == "__main__":
    main()
