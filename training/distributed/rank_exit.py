"""How a rank's process ends once its process group is torn down: without interpreter finalization.

`dist.destroy_process_group()` unregisters the groups but cannot stop gloo's worker threads:
each `ProcessGroupGloo` joins them only in its destructor, and DTensor's process-wide caches
(sharding propagation, redistribute plans, mesh topology: torch 2.13) keep the `DeviceMesh` of
an FSDP2 model, and through it the groups, alive until the interpreter finalizes. A worker thread
that then drops the last reference to a tensor Python created (the buffers of a collective it ran)
must take the GIL; CPython ends a thread that asks for the GIL during finalization with
`pthread_exit`, whose forced unwind through a `noexcept` destructor calls `std::terminate`. The
rank dies with SIGABRT, "terminate called without an active exception", after its work is done,
when that thread is scheduled late (seen in this project's 2-rank tests on a loaded 2-core
machine; pytorch/pytorch#179291 describes the same race for gloo). Measured on torch 2.13.0+cpu:
after a 2-rank FSDP2 step, a barrier, `destroy_process_group()` and `gc.collect()`, four
`pt_gloo_runloop` threads and a `gloo_tcp_loop` thread are still alive
(`tests/training/model/test_causal_lm.py` checks that they outlive the teardown).

So a rank ends with `os._exit` once its collectives are done, its group destroyed and its
output flushed: nothing is left to finalize that a rank needs (its files are closed, the
checkpoint writes are synchronous), and no thread can run into a finalizing interpreter.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

import torch.distributed as dist


def tear_down_process_group() -> None:
    """Every rank's collectives finished (a barrier) before any rank destroys its groups."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def end_rank_process(exit_code: int) -> NoReturn:
    """Destroy any group still open, flush what the rank printed or logged, and end the process."""
    if dist.is_initialized():
        dist.destroy_process_group()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(exit_code)
