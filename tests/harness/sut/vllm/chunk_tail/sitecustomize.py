"""On ``PYTHONPATH`` (a script run without ``-I``), a finding script's engines (patched in its multiprocessing
forkserver, which they are forked from) feed the EAGLE head, at the last position of a prompt chunk that is not the
prompt's last, the prompt token that follows the chunk, as the unpadded path does (``prepare_next_token_ids_cpu``:
``get_token_id(num_computed_tokens + num_scheduled)``). vLLM 0.32.0's padded path
(``SpecDecodeBaseProposer.prepare_next_token_ids_padded``) feeds it the request's last known token
(``get_token_id(num_tokens_no_spec - 1)``), the prompt's last for a prefill; here that index is read as the chunk's
end for each request the step does not finish (``optimistic_seq_lens_cpu``: computed + scheduled), the rest of vLLM
untouched."""
import sys

if any("multiprocessing.forkserver" in arg for arg in sys.orig_argv):  # the engines' server
    from vllm.v1.spec_decode import llm_base_proposer as _proposer
    from vllm.v1.worker import gpu_model_runner as _runner

    _propose = _runner.GPUModelRunner.propose_draft_token_ids
    _prepare = _proposer.SpecDecodeBaseProposer.prepare_next_token_ids_padded

    def _propose_knowing_chunk_ends(self, *args, **kwargs):
        self.drafter.chunk_ends = self.optimistic_seq_lens_cpu[:self.input_batch.num_reqs].tolist()
        return _propose(self, *args, **kwargs)

    def _prepare_at_chunk_end(self, sampled_token_ids, requests, batch, discard_request_mask):
        known = batch.num_tokens_no_spec[:batch.num_reqs].copy()
        for i, end in enumerate(getattr(self, "chunk_ends", ())):
            if end < known[i]:  # a chunk the step does not finish: the next token is the prompt's at ``end``
                batch.num_tokens_no_spec[i] = end + 1
        try:
            return _prepare(self, sampled_token_ids, requests, batch, discard_request_mask)
        finally:
            batch.num_tokens_no_spec[:batch.num_reqs] = known

    _runner.GPUModelRunner.propose_draft_token_ids = _propose_knowing_chunk_ends
    _proposer.SpecDecodeBaseProposer.prepare_next_token_ids_padded = _prepare_at_chunk_end
