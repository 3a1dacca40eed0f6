"""On ``PYTHONPATH`` (a script run without ``-I``), a finding script's engines (patched in its multiprocessing
forkserver, which they are forked from) run vLLM's scheduler with its placeholder padding off: ``dynamic_sd_lookup``
set to the same k at every batch size, which schedules what the scheduler would without one and switches the padding
off (``spec_padding.py`` says why)."""
import sys

if any("multiprocessing.forkserver" in arg for arg in sys.orig_argv):  # the engines' server
    from vllm.v1.core.sched import scheduler as _scheduler

    _init = _scheduler.Scheduler.__init__

    def _unpadded(self, *args, **kwargs):
        _init(self, *args, **kwargs)
        if self.num_spec_tokens and self.dynamic_sd_lookup is None:
            self.dynamic_sd_lookup = [self.num_spec_tokens] * (self.scheduler_config.max_num_seqs + 1)

    _scheduler.Scheduler.__init__ = _unpadded
