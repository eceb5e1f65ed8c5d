"""Where torch writes a target's Flight Recorder dumps, and asking a live rank for one through its pipe."""

from __future__ import annotations

import os
import threading

from mtpdiag.capture.fr_locate import ENV_KEYS, dump_prefixes, pipe_prefix, request_live_dump


def test_the_variables_torch_reads_and_its_defaults():
    assert dump_prefixes({"TORCH_FR_DUMP_TEMP_FILE": "/x/fr_", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/y/"}, "/h") == (
        "/x/fr_",
    )
    assert dump_prefixes({"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/y/trace_"}, "/h") == ("/y/trace_",)
    assert dump_prefixes({}, "/home/u") == ("/home/u/.cache/torch/comm_lib_trace_rank_", "/tmp/nccl_trace_rank_")
    assert dump_prefixes({"XDG_CACHE_HOME": "/c", "TORCH_FR_DUMP_TEMP_FILE": " "}, None) == (
        "/c/torch/comm_lib_trace_rank_",
        "/tmp/.cache/torch/comm_lib_trace_rank_",
        "/tmp/nccl_trace_rank_",
    )
    assert pipe_prefix({"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/p/pipe_"}) == "/p/pipe_" and pipe_prefix({}) is None
    assert set(ENV_KEYS) >= {"TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"}


def test_a_request_reaches_a_reader_and_never_blocks_without_one(tmp_path):
    prefix = str(tmp_path / "pipe_")
    assert request_live_dump(prefix, 3).reason.startswith("No such file")
    os.mkfifo(f"{prefix}3.pipe")
    nobody = request_live_dump(prefix, 3)  # no reader: returns at once, nothing written
    assert (nobody.sent, nobody.path) == (False, f"{prefix}3.pipe") and "no process reads" in nobody.reason
    # a reader like torch's DumpPipe: the pipe opened read-only and non-blocking
    fd = os.open(f"{prefix}3.pipe", os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert request_live_dump(prefix, 3).sent
        assert os.read(fd, 128) == b"1\n"
    finally:
        os.close(fd)


def test_a_regular_file_named_like_the_pipe_is_left_alone(tmp_path):
    path = tmp_path / "pipe_0.pipe"
    path.write_text("")
    done = []
    t = threading.Thread(target=lambda: done.append(request_live_dump(str(tmp_path / "pipe_"), 0)), daemon=True)
    t.start()
    t.join(10)
    assert done and not done[0].sent and done[0].reason == "not a named pipe" and path.read_text() == ""
