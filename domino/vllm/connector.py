"""A hidden-states KV connector for vLLM that also runs on the CPU backend.

vLLM's ``extract_hidden_states`` speculative method stores the requested aux layers of every
prompt token in a cache-only attention layer, and a KV connector writes them to one
safetensors file per request. The connector vLLM ships (``ExampleHiddenStatesConnector``)
copies device-to-host on a CUDA stream into pinned memory, which the CPU backend refuses
("pin_memory=True requires a CUDA or other accelerator backend"). This subclass keeps its
scheduler side and file format and replaces the one worker-side method that copies and
writes: a plain synchronous copy, then an atomic write. It costs a device sync per finished
request, which offline extraction does not mind, and runs the same on a GPU and on a CPU.

Loaded by vLLM from ``kv_transfer_config`` (``kv_connector="SyncHiddenStatesConnector"``,
``kv_connector_module_path="domino.vllm.connector"``); only importable where vLLM is.
"""

from __future__ import annotations

import os

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class _Done:
    """Stands in for the CUDA event the parent polls: the copy is finished when we return."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class SyncHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        slots = (offsets[None, :] + block_ids[:, None] * self._block_size).flatten()
        n = pending.token_ids.shape[0]
        states = extract_from_kv_cache(self._kv_cache, slots.to(self._kv_cache.device), n)
        tensors = {"hidden_states": states.to("cpu").clone().contiguous(),
                   "token_ids": pending.token_ids.clone()}
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        try:
            tmp = f"{pending.filename}.tmp-{os.getpid()}"
            save_file(tensors, tmp)
            os.replace(tmp, pending.filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)  # releases the reader's wait
        self._req_copy_events[pending.req_id] = _Done()
