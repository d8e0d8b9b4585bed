"""Whether this host lets a process count its own CPU cycles and instructions (perf_event_open,
user space only, the calling thread): one line per counter, "NAME ok N" with what a short loop
counted, or "NAME fail ERROR". Where both fail (a host without a PMU for processes: ENOENT),
CPU cost can be measured only in time.

  python3 bench/workloads/perf_counters_probe.py
"""
import ctypes
import os
import struct

SYS_PERF_EVENT_OPEN = 298  # x86-64


class PerfEventAttr(ctypes.Structure):
    """The leading fields of struct perf_event_attr (PERF_ATTR_SIZE_VER1)."""
    _fields_ = [("type", ctypes.c_uint32), ("size", ctypes.c_uint32), ("config", ctypes.c_uint64),
                ("sample_period", ctypes.c_uint64), ("sample_type", ctypes.c_uint64),
                ("read_format", ctypes.c_uint64), ("flags", ctypes.c_uint64),
                ("wakeup_events", ctypes.c_uint32), ("bp_type", ctypes.c_uint32),
                ("config1", ctypes.c_uint64), ("config2", ctypes.c_uint64)]


def open_counter(libc, config):
    """A hardware counter (PERF_TYPE_HARDWARE, `config`) of this thread in user space."""
    attr = PerfEventAttr(type=0, size=ctypes.sizeof(PerfEventAttr), config=config,
                         flags=(1 << 5) | (1 << 6))  # exclude_kernel, exclude_hv
    fd = libc.syscall(SYS_PERF_EVENT_OPEN, ctypes.byref(attr), 0, -1, -1, 0)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


def main():
    libc = ctypes.CDLL(None, use_errno=True)
    for name, config in (("cycles", 0), ("instructions", 1)):
        try:
            fd = open_counter(libc, config)
            before = struct.unpack("Q", os.read(fd, 8))[0]
            sum(range(100000))
            after = struct.unpack("Q", os.read(fd, 8))[0]
            os.close(fd)
            print(name, "ok", after - before)
        except OSError as e:
            print(name, "fail", e)


if __name__ == "__main__":
    main()
