#!/usr/bin/env python3
"""Writes the binary seed inputs of register_request_fuzz and board_drain_fuzz (the text seeds of
the other targets are written by hand). Layouts follow contract/orion_contract.h; run from any
folder:  python3 tests/fuzz/make_seeds.py"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
WIRE_MAGIC, WIRE_VERSION, REGISTER = 0x5057524F, 3, 1  # contract::kWireVersion
NO_VALUE = 0xFFFFFFFF


def write(target, name, data):
    path = os.path.join(HERE, "corpus", target, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


# ---- RegisterRequest (256 bytes) ----
def register_request(magic=WIRE_MAGIC, version=WIRE_VERSION, mtype=REGISTER, nbytes=256,
                     pid=4242, ordinal=0, uuid=b"GPU-8f4c2e1a-0000-1111-2222-333344445555",
                     priority=1, flags=0, limit=0, target_us=0, name=b"python",
                     millicpus=NO_VALUE):
    r = struct.pack("<IIII", magic, version, mtype, nbytes)
    r += struct.pack("<II", pid, ordinal) + uuid.ljust(48, b"\0")[:48]
    r += struct.pack("<IIQQ", priority, flags, limit, target_us) + name.ljust(64, b"\0")[:64]
    r += struct.pack("<I", millicpus) + b"\0" * 92
    assert len(r) == 256
    return r


write("register_request_fuzz", "valid-high", register_request(limit=8 << 30, target_us=15000))
write("register_request_fuzz", "valid-unset-priority",
      register_request(priority=NO_VALUE, uuid=b"", ordinal=3, name=b"serve-model-1"))
write("register_request_fuzz", "valid-best-effort-unterminated-name",
      register_request(priority=0, name=b"t" * 64, uuid=b"G" * 48))
write("register_request_fuzz", "invalid-magic", register_request(magic=0x12345678))
write("register_request_fuzz", "invalid-version", register_request(version=WIRE_VERSION - 1))
write("register_request_fuzz", "valid-one-cpu", register_request(millicpus=1000))
write("register_request_fuzz", "invalid-goodbye-type", register_request(mtype=3, nbytes=64))
write("register_request_fuzz", "invalid-priority", register_request(priority=5))
write("register_request_fuzz", "invalid-ordinal", register_request(ordinal=5000))
write("register_request_fuzz", "invalid-short-read", register_request()[:100])
write("register_request_fuzz", "invalid-long-read", register_request() + b"\0" * 16)

# ---- board_drain_fuzz: 4 slot windows of 3072 bytes, then optionally the board header ----
WINDOW, ENTRIES, ENTRY = 3072, 16, 168
K_LAUNCH, K_NAME, K_ALLOC, K_FREE, K_MEMCPY, K_MEMSET, K_GRAPH, K_TIME, K_THROTTLED, \
    K_DENIED, K_BUSY = range(1, 12)
T0 = 5_000_000_000_000  # a CLOCK_MONOTONIC value (ns)


def event(kind, aux=0, cpu_ns=T0, func=0, stream=0, nbytes=0, duration=0, grid=(1, 1, 1),
          block=(1, 1, 1), shared=0, name=b""):
    e = struct.pack("<IIQQQQQ", kind, aux, cpu_ns, func, stream, nbytes, duration)
    e += struct.pack("<3I3III", *grid, *block, shared, 0) + name.ljust(80, b"\0")[:80]
    assert len(e) == 160
    return e


def window(events, gpu=0, priority=0, head=None, tail=0, published=None, dropped=0,
           launches=0, used=0, inflight=0, progress=0):
    """A slot window: server fields, client counters, ring header, entries at positions
    tail, tail+1, ... (entry index = position % 2048; all within the window here)."""
    head = tail + len(events) if head is None else head
    slot = struct.pack("<8I", 1, 1, 0, 4242, gpu, priority, 0, 0)
    slot += struct.pack("<7Q", 0, used, used, launches, 0, progress, 0)
    slot += struct.pack("<4IQ", inflight, 0, 0, 0, 0)
    slot = slot.ljust(256, b"\0")
    ring = struct.pack("<Q", head).ljust(64, b"\0") + struct.pack("<QQ", tail, dropped)
    ring = ring.ljust(128, b"\0")
    entries = bytearray(ENTRIES * ENTRY)
    for k, e in enumerate(events):
        pos = tail + k
        idx = pos % 2048
        assert idx < ENTRIES
        ok = published is None or published[k]
        entries[idx * ENTRY:(idx + 1) * ENTRY] = struct.pack("<Q", pos + 1 if ok else 0) + e
    w = slot + ring + bytes(entries)
    assert len(w) == WINDOW
    return w


gemm = b"volta_sgemm_128x64_nn"
add = b"void at::native::elementwise_kernel<128, 4>"
hp0 = [event(K_NAME, func=0x1000, name=gemm),
       event(K_LAUNCH, func=0x1000, grid=(80, 1, 1), block=(256, 1, 1), stream=7),
       event(K_TIME, func=0x1000, duration=41000),
       event(K_LAUNCH, func=0x1000, grid=(80, 1, 1), block=(256, 1, 1), cpu_ns=T0 + 50000),
       event(K_BUSY, cpu_ns=T0, duration=1_500_000),
       event(K_BUSY, cpu_ns=T0 + 4_000_000, duration=3_000_000),
       event(K_GRAPH, func=0xBEEF, aux=42, stream=7)]
be1 = [event(K_NAME, func=0x2000, name=add),
       event(K_LAUNCH, func=0x2000, grid=(1024, 1, 1), block=(128, 1, 1)),
       event(K_THROTTLED, duration=200_000),
       event(K_MEMCPY, aux=1, nbytes=1 << 20, stream=3),
       event(K_MEMSET, nbytes=4096),
       event(K_ALLOC, func=0x7F0000000000, nbytes=1 << 30),
       event(K_FREE, func=0x7F0000000000, nbytes=1 << 30),
       event(K_DENIED, nbytes=1 << 34)]
# HP client of GPU 1 with a 500 us target: busy periods over it, so the budget shrinks.
hp2 = [event(K_BUSY, cpu_ns=T0 + i * 1_000_000, duration=900_000 + i) for i in range(16)]
be3 = [event(K_LAUNCH, func=0x3000 + i, grid=(i + 1, 2, 3), block=(32, 4, 1)) for i in range(5)]
valid = (window(hp0, gpu=0, priority=1, launches=3, used=1 << 30, inflight=1, progress=T0)
         + window(be1, gpu=0, priority=0, launches=1, used=1 << 20)
         + window(hp2, gpu=1, priority=1)
         + window(be3, gpu=1, priority=0, launches=5))
write("board_drain_fuzz", "empty", b"")
write("board_drain_fuzz", "valid-events", valid)
write("board_drain_fuzz", "valid-client0-only", window(hp0, gpu=0, priority=1))
# A producer that died between claim and publish: the entry at position 1 stays a hole.
write("board_drain_fuzz", "hole-in-ring",
      window(hp0[:3], gpu=0, priority=1, published=[True, False, True]))
# Positions far along (the ring wrapped many times), a full ring's drop count, huge counters.
write("board_drain_fuzz", "far-positions",
      window(be3, tail=(1 << 40) * 2048 + 3, dropped=(1 << 64) - 1, launches=(1 << 64) - 1,
             used=(1 << 63)) * 4)
# head behind tail, a garbage event kind, a name without its NUL, durations at the bounds.
odd = [event(999, func=1), event(K_NAME, func=2, name=b"x" * 80),
       event(K_TIME, func=2, duration=600_000_000_000), event(K_BUSY, duration=599_999_999_999),
       event(K_LAUNCH, grid=(0xFFFFFFFF,) * 3, block=(0xFFFFFFFF,) * 3)]
write("board_drain_fuzz", "odd-events", window(odd, gpu=7, priority=9) +
      window(odd, head=0, tail=2))


# The board's header and GPU states as the server writes them for two GPUs.
def head_region():
    header = struct.pack("<8I", 0x4D42524F, 2, 256, 256, 344448, 2, 256, 2048)
    header += struct.pack("<QQ", 1_700_000_000_000_000_000, T0)
    header = header.ljust(256, b"\0")
    gpus = b""
    for g, uuid in enumerate([b"GPU-11111111-2222-3333-4444-555555555555",
                              b"GPU-66666666-7777-8888-9999-000000000000"]):
        # present, mode, gate_seq, gate_waiters, hp_slot_mask[4], be_budget_ns,
        # be_outstanding_ns, sm_threshold, spin_ns, hp_stale_ns | uuid | hp_grace_ns, be_period,
        # be_clients, tracker_seq
        s = struct.pack("<4I4QQQIIQ", 1, 1, 7, 0, 1 << g, 0, 0, 0, 500_000, 0, 0, 20000,
                        1_000_000_000)
        assert len(s) == 80
        s += uuid.ljust(48, b"\0") + struct.pack("<QQII", 500_000, 0, 1, 0)
        gpus += s.ljust(256, b"\0")
    gpus = gpus.ljust(16 * 256, b"\0")
    return header + gpus


write("board_drain_fuzz", "valid-events-and-header", valid + head_region())
