"""The feature store: rows read from features.npy (cache hits, misses, both) equal an in-RAM index_select bit for
bit, with either reader (io_uring, the pread pool); hit accounting; a file truncated, replaced, removed or
unreadable is an error naming it; which reader a store uses, and why."""
from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from morphpipe import native
from morphpipe.data import feature_store
from morphpipe.data.dtypes import tensor_to_numpy
from morphpipe.data.feature_store import (READER_ENV, FeatureStore, choose_reader, hottest_rows, npy_layout,
                                         reader_line)
from morphpipe.data.store import load_dataset

BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def random_rows(num_rows: int, width: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Rows of random bit patterns (NaNs and infinities included), so equality is checked bit for bit."""
    generator = torch.Generator().manual_seed(seed)
    bits = torch.randint(-2**15, 2**15, (num_rows, width), generator=generator, dtype=torch.int32)
    if dtype == torch.float32:
        bits = bits * 65536 + torch.randint(0, 2**16, (num_rows, width), generator=generator, dtype=torch.int32)
    return bits.to(BITS[dtype]).view(dtype)


def save_features(tmp_path, features: torch.Tensor, name: str = "features.npy"):
    path = tmp_path / name
    np.save(path, tensor_to_numpy(features))
    return path


def assert_same_bits(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.equal(got.view(BITS[got.dtype]), expected.view(BITS[expected.dtype]))


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@pytest.fixture(params=["io_uring", "pread"])
def reader(request, monkeypatch) -> str:
    """Each reader in turn, also for stores opened without one named (through the environment variable)."""
    if request.param == "io_uring" and native.load().io_uring_unavailable_reason():
        pytest.skip(f"io_uring is unavailable here: {native.load().io_uring_unavailable_reason()}")
    monkeypatch.setenv(READER_ENV, request.param)
    return request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=dtype_name)
@pytest.mark.parametrize("width", [1, 3, 64, 127, 768])
def test_rows_equal_index_select_for_hits_misses_and_both(tmp_path, dtype, width, reader):
    num_rows = 3000 if width < 100 else 400  # every case spans many 4 KiB pages, rows straddling page ends
    features = random_rows(num_rows, width, dtype)
    path = save_features(tmp_path, features)
    hotness = torch.arange(num_rows) % 7
    generator = torch.Generator().manual_seed(width)
    ids = torch.cat([torch.randint(0, num_rows, (500,), generator=generator),  # repeats included
                     torch.arange(num_rows - 40, num_rows), torch.tensor([0, 1, 0])])
    row_bytes = width * features.element_size()
    for cache_rows in (0, 5, num_rows // 2, num_rows):
        store = FeatureStore(path, dtype_name(dtype), cache_bytes=cache_rows * row_bytes, hotness=hotness,
                             io_threads=3)
        assert store.num_cached == cache_rows and store.reader == reader
        assert_same_bits(store.gather(ids), torch.index_select(features, 0, ids))
        counters = store.counters()
        assert counters.hits + counters.misses == ids.numel()
        assert (counters.misses == 0) == (cache_rows == num_rows)


@pytest.mark.parametrize("io_threads", [0, 1, 8])
def test_rows_are_the_same_for_any_number_of_io_threads(tmp_path, io_threads, reader):
    features = random_rows(20_000, 5, torch.float16)
    path = save_features(tmp_path, features)
    ids = torch.randperm(20_000, generator=torch.Generator().manual_seed(1))[:7000]
    store = FeatureStore(path, io_threads=io_threads)
    assert_same_bits(store.gather(ids), features[ids])
    assert store.counters().reads < ids.numel(), "rows that share a page are read together"


def test_direct_reads_equal_buffered_reads(tmp_path, reader):
    features = random_rows(5000, 33, torch.float32)
    path = save_features(tmp_path, features)
    ids = torch.randint(0, 5000, (900,), generator=torch.Generator().manual_seed(2))
    buffered = FeatureStore(path, direct=False, cache_bytes=100 * 33 * 4, hotness=torch.arange(5000))
    store = FeatureStore(path, cache_bytes=100 * 33 * 4, hotness=torch.arange(5000))  # O_DIRECT where allowed
    if not store.direct:
        pytest.skip(f"the file system of {tmp_path} refuses O_DIRECT")
    for ids in (ids, torch.tensor([4999, 0])):  # the last row ends mid-page, at the end of the file
        assert_same_bits(store.gather(ids), features[ids])
        assert_same_bits(buffered.gather(ids), features[ids])
    assert not buffered.direct


def test_hit_accounting_matches_a_count_by_hand(tmp_path):
    features = random_rows(100, 4, torch.float32)
    path = save_features(tmp_path, features)
    hotness = torch.zeros(100)
    hotness[[3, 50, 97]] = torch.tensor([2.0, 9.0, 2.0])  # 50 first, then 3 and 97 (tie: the lower id)
    store = FeatureStore(path, cache_bytes=2 * 16 + 15, hotness=hotness)  # room for 2 rows, not 3
    assert store.num_cached == 2 and store.cache_bytes == 32
    ids = torch.tensor([50, 3, 97, 50, 0, 3, 99, 50])
    assert_same_bits(store.gather(ids), features[ids])
    cached = {50, 3}
    hits = sum(int(i) in cached for i in ids)
    counters = store.counters()
    assert (counters.hits, counters.misses) == (hits, ids.numel() - hits) == (5, 3)
    assert counters.hit_ratio == 5 / 8
    store.gather(torch.tensor([97]))
    assert store.counters().misses == 4
    store.reset_counters()
    assert store.counters() == type(counters)(0, 0, 0, 0, 0.0, 0)


def test_read_time_counts_while_gathers_read_side_by_side(tmp_path, reader):
    """Two threads gathering back to back keep reads in flight without a gap: the counters, read meanwhile, still
    hold the reading time so far (it was added only when no gather was reading, so re-planning saw 0 s)."""
    path = save_features(tmp_path, random_rows(20_000, 48, torch.float16))
    store = FeatureStore(path, io_threads=2)
    ids = torch.randperm(20_000, generator=torch.Generator().manual_seed(3))[:4000]
    stop = threading.Event()

    def gather_until_stopped() -> None:
        while not stop.is_set():
            store.gather(ids)

    threads = [threading.Thread(target=gather_until_stopped) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        while store.counters().read_gathers < 4:
            stop.wait(0.01)
        during = store.counters()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert during.read_seconds > 0 and during.reads_per_second is not None
    assert store.counters().read_seconds >= during.read_seconds


def test_the_store_times_its_reads_and_counts_them_as_a_gather_reads(tmp_path, reader):
    features = random_rows(20_000, 48, torch.float16)  # rows of 96 B: many share a page
    path = save_features(tmp_path, features)
    hotness = torch.arange(20_000, 0, -1)  # rows 0.. hottest
    store = FeatureStore(path, cache_bytes=5000 * 96, hotness=hotness, io_threads=4)
    assert store.counters().read_seconds == 0.0 and store.counters().reads_per_second is None
    store.gather(torch.arange(0, 5000))  # every row cached: no read, no read time
    assert store.counters().reads == store.counters().read_gathers == 0 and store.counters().read_seconds == 0.0
    ids = torch.randperm(20_000, generator=torch.Generator().manual_seed(3))[:3000]
    for _ in range(3):
        store.gather(ids)
    counters = store.counters()
    misses = ids[ids >= 5000]
    assert counters.misses == 3 * misses.numel() and counters.read_gathers == 3
    # The reads counted without reading are those the gathers issued, whatever the cache holds (the misses given).
    assert (3 * store.count_reads(misses)[0], 3 * store.count_reads(misses)[1]) == (counters.reads,
                                                                                    counters.bytes_read)
    assert counters.read_seconds > 0 and counters.reads_per_second == counters.reads / counters.read_seconds
    latency = counters.read_latency_s(store.io_threads)
    assert latency == pytest.approx(counters.read_seconds * 5 / counters.reads)  # 5 in flight: 4 threads + caller,
    # or a ring 5 deep
    assert store.count_reads(torch.tensor([7, 7, 8])) == (1, 4096 if store.direct else 2 * 96)  # one page
    store.reset_counters()
    assert store.counters() == type(counters)(0, 0, 0, 0, 0.0, 0)
    with pytest.raises(RuntimeError, match=r"count_reads: ids\[0\] = 20000 is outside \[0, 20000\)"):
        store.count_reads(torch.tensor([20_000]))


def test_misses_up_to_16_kib_apart_share_a_read_and_farther_ones_take_their_own(tmp_path):
    features = random_rows(64, 256, torch.float16)  # rows of 512 B: row 32 starts 16 KiB after row 0
    store = FeatureStore(save_features(tmp_path, features), io_threads=1)
    assert store.count_reads(torch.tensor([0, 32]))[0] == 1  # 15.5 KiB between the rows: read through
    assert store.count_reads(torch.tensor([0, 34]))[0] == 2  # 16.5 KiB: another read costs less
    assert_same_bits(store.gather(torch.tensor([34, 0, 32])), features[[34, 0, 32]])


def test_hottest_rows_break_ties_towards_the_lower_id():
    assert hottest_rows(torch.tensor([1, 5, 5, 0, 5, 2]), 3).tolist() == [1, 2, 4]
    assert hottest_rows(torch.tensor([1, 5, 5, 0, 5, 2]), 4).tolist() == [1, 2, 4, 5]


def test_data_offset_comes_from_the_npy_header(tmp_path):
    features = random_rows(10, 3, torch.float16)
    path = save_features(tmp_path, features)
    layout = npy_layout(path)
    assert layout.shape == (10, 3) and layout.dtype == np.float16
    assert os.path.getsize(path) == layout.data_offset + features.numel() * 2


def test_a_pickled_store_reopens_the_file(tmp_path):
    features = random_rows(50, 4, torch.bfloat16)
    path = save_features(tmp_path, features)
    store = FeatureStore(path, "bfloat16", cache_bytes=80, hotness=torch.arange(50), reader="pread")
    copy = pickle.loads(pickle.dumps(store))
    assert copy.num_cached == 10 and copy.reader == "pread"
    assert_same_bits(copy.gather(torch.arange(40, 50)), features[40:])  # the same ten hottest rows, cached
    assert (copy.counters().hits, copy.counters().misses) == (10, 0)
    assert_same_bits(copy.gather(torch.arange(50)), features)


def test_a_store_keeps_its_cached_rows_not_the_hotness_they_were_chosen_by(tmp_path):
    path = save_features(tmp_path, random_rows(100_000, 1, torch.float16))
    store = FeatureStore(path, cache_bytes=20, hotness=torch.arange(100_000))
    assert len(pickle.dumps(store)) < 10_000  # ten row ids, not 100,000 hotness values (800 kB)


def test_bad_ids_and_dtypes_are_refused_with_the_value(tmp_path):
    features = random_rows(10, 2, torch.bfloat16)
    path = save_features(tmp_path, features)
    with pytest.raises(ValueError, match="uint16.*dtype='bfloat16'"):
        FeatureStore(path)
    with pytest.raises(ValueError, match="holds uint16, but dtype 'float16'"):
        FeatureStore(path, "float16")
    store = FeatureStore(path, "bfloat16")
    with pytest.raises(RuntimeError, match=r"ids\[1\] = 10 is outside \[0, 10\)"):
        store.gather(torch.tensor([0, 10]))
    with pytest.raises(TypeError, match="integer row ids"):
        store.gather(torch.tensor([0.0]))
    with pytest.raises(ValueError, match="hotness: a cache of 8 bytes needs one hotness value per row"):
        FeatureStore(path, "bfloat16", cache_bytes=8)
    with pytest.raises(ValueError, match="io_threads: 5000 I/O threads is more than the 1024"):
        FeatureStore(path, "bfloat16", io_threads=5000)


def test_a_graph_reopens_its_store_with_the_planned_cache_and_io_threads(tmp_path):
    from morphpipe.data import GeneratorSpec, generate

    generate(GeneratorSpec(kind="community", num_nodes=500, avg_degree=4, feature_dim=16), tmp_path / "graph",
             progress=False)
    graph = load_dataset(tmp_path / "graph", features_on_disk=True)
    store = graph.open_feature_store(64 * 10, io_threads=5)  # float32 rows of 64 B: 10 cached
    assert (store.io_threads, store.num_cached, graph.feature_store is store) == (5, 10, True)
    assert graph.open_feature_store(0).io_threads == 5  # not given: the open store's I/O threads kept


def test_a_file_truncated_in_use_is_an_error_naming_it(tmp_path, reader):
    features = random_rows(3000, 8, torch.float32)
    path = save_features(tmp_path, features)
    store = FeatureStore(path, cache_bytes=100 * 32, hotness=-torch.arange(3000))  # rows 0..99 cached
    store.gather(torch.arange(10))
    os.truncate(path, os.path.getsize(path) // 2)
    for ids in (torch.tensor([2999]), torch.tensor([5])):  # a miss past the new end; a cached row
        with pytest.raises(RuntimeError, match=f"features file {path} shrank from"):
            store.gather(ids)


def test_a_file_replaced_or_removed_in_use_is_an_error_naming_it(tmp_path, reader):
    features = random_rows(100, 8, torch.float32)
    path = save_features(tmp_path, features)
    store = FeatureStore(path)
    replacement = save_features(tmp_path, random_rows(100, 8, torch.float32, seed=1), "new.npy")
    os.replace(replacement, path)
    with pytest.raises(RuntimeError, match=f"features file {path} was replaced by another file"):
        store.gather(torch.tensor([1]))
    os.unlink(path)
    with pytest.raises(RuntimeError, match=f"features file {path} is gone"):
        store.gather(torch.tensor([1]))


def test_a_file_cut_short_or_unreadable_is_refused_naming_it(tmp_path, reader):
    path = save_features(tmp_path, random_rows(100, 8, torch.float32))
    os.truncate(path, os.path.getsize(path) - 1)
    with pytest.raises(RuntimeError, match=f"features file {path} holds .* bytes, but 100 rows of 32 bytes"):
        FeatureStore(path)
    with pytest.raises(FileNotFoundError, match="missing.npy"):
        FeatureStore(tmp_path / "missing.npy")
    # A path the kernel will not read rows from (a directory): the pread error names it.
    unreadable = native.load().FeatureStore(str(tmp_path), 0, 1, 1, torch.float32, torch.empty(0, dtype=torch.long),
                                            0, False, reader == "io_uring")
    with pytest.raises(RuntimeError, match=f"features file {tmp_path}: reading bytes \\[0, 4\\) failed"):
        unreadable.gather(torch.tensor([0]))


def test_a_read_error_on_an_io_thread_reaches_the_caller(tmp_path, reader):
    """Reads far apart go to several I/O threads (or entries of a ring); the error of any of them comes back to the
    caller, a ring's only after the reads still in flight were reaped."""
    directory = tmp_path / "rows"
    directory.mkdir()
    for index in range(400):  # a directory whose size spans many pages, and which pread refuses to read
        (directory / f"{index:0200d}").touch()
    num_rows = os.path.getsize(directory) // 4
    if num_rows < 20_000:
        pytest.skip(f"this file system keeps {directory} at {num_rows * 4} bytes")
    unreadable = native.load().FeatureStore(str(directory), 0, num_rows, 1, torch.float32,
                                            torch.empty(0, dtype=torch.long), 4, False, reader == "io_uring")
    with pytest.raises(RuntimeError, match=f"features file {directory}: reading bytes .* failed: Is a directory"):
        unreadable.gather(torch.arange(0, 20_000, 2000))  # 8 KB apart: ten separate reads


def test_gathers_side_by_side_each_get_their_rows(tmp_path, reader):
    """Concurrent gathers share the pool's threads, or each take a ring of their own; none sees another's rows."""
    features = random_rows(30_000, 24, torch.float16)
    path = save_features(tmp_path, features)
    store = FeatureStore(path, cache_bytes=3000 * 48, hotness=torch.arange(30_000) % 11, io_threads=6)
    results: dict[int, bool] = {}

    def gather(seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        same = True
        for _ in range(5):
            ids = torch.randint(0, 30_000, (4000,), generator=generator)
            same &= torch.equal(store.gather(ids).view(torch.int16), features[ids].view(torch.int16))
        results[seed] = same

    threads = [threading.Thread(target=gather, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {seed: True for seed in range(4)}
    assert store.counters().misses > 0


@pytest.mark.parametrize("default", ["pread", "io_uring"])
def test_the_reader_is_the_default_one_unless_forced(tmp_path, monkeypatch, default):
    path = save_features(tmp_path, random_rows(10, 2, torch.float32))
    monkeypatch.delenv(READER_ENV, raising=False)
    monkeypatch.setattr(feature_store, "DEFAULT_READER", default)
    unavailable = native.load().io_uring_unavailable_reason()
    store = FeatureStore(path, io_threads=7)
    if default == "pread":
        assert (store.reader, store.reader_note) == ("pread", "")
        assert store.describe_reader() == "pread pool of 7 I/O threads"
        if not unavailable:
            assert reader_line() == f"pread pool (the default; {READER_ENV}=io_uring switches to io_uring)"
    elif unavailable:
        assert (store.reader, store.reader_note) == ("pread", f"io_uring unavailable: {unavailable}")
        assert store.describe_reader() == f"pread pool of 7 I/O threads (io_uring unavailable: {unavailable})"
    else:
        assert (store.reader, store.reader_note) == ("io_uring", "")
        assert store.describe_reader() == "io_uring, 8 reads in flight per gather"
        assert reader_line() == f"io_uring (the default; {READER_ENV}=pread switches to the pread pool)"
    for forced in ("pread", "io_uring"):
        if forced == "io_uring" and unavailable:
            continue
        monkeypatch.setenv(READER_ENV, forced)
        store = FeatureStore(path, io_threads=7)
        assert store.reader == forced and store.describe_reader().endswith(f"(forced by {READER_ENV})")
        assert f"reader={forced!r}" in repr(store)
        assert reader_line().endswith(f"(forced by {READER_ENV})")
    named = FeatureStore(path, io_threads=7, reader="pread")  # a reader named wins over the environment
    assert named.describe_reader() == "pread pool of 7 I/O threads" and named.io_threads == 7


def test_an_unknown_or_unavailable_reader_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setenv(READER_ENV, "aio")
    with pytest.raises(ValueError, match=f"{READER_ENV}='aio' is not a feature store reader; set it to one of "
                                         "io_uring, pread"):
        choose_reader()
    with pytest.raises(ValueError, match="reader: 'threads' is not a feature store reader"):
        choose_reader("threads")
    # Where io_uring_setup fails (a seccomp filter, kernel.io_uring_disabled, an old kernel), the pread pool reads.
    refusal = "io_uring_setup failed: Operation not permitted"
    monkeypatch.setattr(native.load(), "io_uring_unavailable_reason", lambda: refusal)
    monkeypatch.delenv(READER_ENV)
    monkeypatch.setattr(feature_store, "DEFAULT_READER", "io_uring")
    assert choose_reader() == ("pread", f"io_uring unavailable: {refusal}")
    with pytest.raises(ValueError, match=f"reader='io_uring': io_uring cannot be used in this process \\({refusal}\\); "
                                         "read with the pread pool"):
        choose_reader("io_uring")


# Run in a child process under a seccomp filter that makes io_uring_setup fail with EPERM (as a container's
# default profile may), then open a store: it must fall back to the pread pool, say why, and read the same rows.
SECCOMP_CHILD = """
import ctypes, struct, sys
import torch
libc = ctypes.CDLL(None, use_errno=True)
IO_URING_SETUP, EPERM = 425, 1
filter = b"".join(struct.pack("HBBI", *op) for op in [
    (0x20, 0, 0, 0),                      # load the syscall number
    (0x15, 0, 1, IO_URING_SETUP),         # io_uring_setup?
    (0x06, 0, 0, 0x00050000 | EPERM),     # then fail with EPERM
    (0x06, 0, 0, 0x7FFF0000)])            # else allow
program = ctypes.create_string_buffer(filter)
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
fprog = Fprog(len(filter) // 8, ctypes.addressof(program))
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0, ctypes.get_errno()  # PR_SET_SECCOMP, FILTER
from morphpipe.data import feature_store
feature_store.DEFAULT_READER = "io_uring"  # whatever the default, a store falls back when io_uring is refused
store = feature_store.FeatureStore(sys.argv[1], io_threads=3)
ids = torch.tensor([5, 0, 99, 5])
features = torch.from_numpy(__import__("numpy").load(sys.argv[1]))
assert torch.equal(store.gather(ids).view(torch.int32), features[ids].view(torch.int32))  # NaNs too
print(store.describe_reader())
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the filter names x86_64's io_uring_setup number")
def test_where_seccomp_forbids_io_uring_the_pread_pool_reads_and_says_why(tmp_path):
    path = save_features(tmp_path, random_rows(100, 4, torch.float32))
    environment = {key: value for key, value in os.environ.items() if key != READER_ENV}
    child = subprocess.run([sys.executable, "-c", SECCOMP_CHILD, str(path)], capture_output=True, text=True,
                           env=environment, timeout=120)
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.strip().splitlines()[-1] == ("pread pool of 3 I/O threads (io_uring unavailable: "
                                                     "io_uring_setup failed: Operation not permitted)")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_reads_through_rings_of_its_own(tmp_path, reader):
    features = random_rows(20_000, 8, torch.float16)
    path = save_features(tmp_path, features)
    store = FeatureStore(path, io_threads=4)
    ids = torch.randperm(20_000, generator=torch.Generator().manual_seed(5))[:3000]
    assert_same_bits(store.gather(ids), features[ids])  # the parent's ring (or pool) is open before the fork
    expected = features[ids].view(torch.int16).numpy().tobytes()
    # Forks right after a gather, 20 times: a pool thread still holding the pool's lock at the fork left the child
    # waiting for ever (the parent's pool is not the child's; it starts its own).
    for _ in range(20):
        store.gather(ids)
        pid = os.fork()
        if pid == 0:  # the child gathers while the parent does too; each must get its own rows (no torch op after fork)
            same = all(store.gather(ids).view(torch.int16).numpy().tobytes() == expected for _ in range(3))
            os._exit(0 if same else 1)
        for _ in range(3):
            assert_same_bits(store.gather(ids), features[ids])
        assert child_exit_code(pid, timeout_s=60) == 0


def child_exit_code(pid: int, timeout_s: float) -> int:
    """The forked child's exit code; a child still running after `timeout_s` is killed and the test fails."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child was still gathering after {timeout_s} s (deadlocked)")


def test_a_graph_ranks_its_cache_by_the_hotness_given_and_reopens_its_store(tmp_path):
    from morphpipe.data import GeneratorSpec, generate

    generate(GeneratorSpec(kind="community", num_nodes=500, avg_degree=4, feature_dim=16), tmp_path / "graph",
             progress=False)
    graph = load_dataset(tmp_path / "graph", features_on_disk=True)
    graph.open_feature_store(64 * 10, io_threads=3)
    assert graph.cache_ranked_by == "in-degree" and torch.equal(graph.cache_hotness(), graph.in_degrees())
    hotness = torch.arange(500, dtype=torch.float64)  # rows 490..499 hottest
    graph.rank_feature_cache(hotness, "a test's ranking")
    store = graph.feature_store
    assert (store.num_cached, store.io_threads, graph.cache_ranked_by) == (10, 3, "a test's ranking")
    store.gather(torch.arange(490, 500))
    assert (store.counters().hits, store.counters().misses) == (10, 0)
    assert graph.open_feature_store(64 * 20).num_cached == 20  # a re-sized cache keeps the ranking
    with pytest.raises(ValueError, match=r"hotness: expected one real value per node of .*, shape \(500,\), got "
                                         r"\(499,\)"):
        graph.rank_feature_cache(hotness[:499], "short")
    assert graph.cache_ranked_by == "a test's ranking"


def test_a_hotness_that_is_not_finite_is_refused_with_the_row(tmp_path):
    path = tmp_path / "features.npy"
    np.save(path, np.zeros((10, 4), dtype=np.float32))
    hotness = torch.zeros(10, dtype=torch.float64)
    hotness[6] = float("nan")
    with pytest.raises(ValueError, match="hotness: row 6 has hotness nan"):
        FeatureStore(path, cache_bytes=32, hotness=hotness)
