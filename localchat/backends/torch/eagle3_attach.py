"""`--speculative eagle`: load an EAGLE-3 head, check it against the runner's model and have the runner keep
the hidden states it reads: the plain layer loop's taps (eagle3_proposer.py) or the hybrid loop's
(hybrid_taps.py). Its own module so that the proposer never imports the hybrid taps built on it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from localchat.backends.torch.eagle3_head import Eagle3Head, Eagle3LoadError
from localchat.backends.torch.eagle3_proposer import PLAIN_LOOPS, Eagle3Proposer, HiddenTaps
from localchat.backends.torch.hybrid_taps import HybridModel, HybridTaps

if TYPE_CHECKING:
    from localchat.backends.torch.runner import TorchRunner


def attach_eagle3(runner: TorchRunner, head_path: str, target_name: str, token_limit: int) -> Eagle3Proposer:
    """Load the head, check it fits the runner's model (typed errors), and have the runner keep the
    hidden states it reads from now on."""
    model = runner.model
    config = runner.config
    hybrid = isinstance(model, HybridModel)  # Qwen3.5 / Qwen3-Next: its loop keeps the layers' inputs
    if not hybrid and type(model).hidden_states not in PLAIN_LOOPS:
        raise Eagle3LoadError(
            f"--speculative eagle: {target_name} ({config.model_type}) runs its layers in its own loop; "
            "EAGLE-3 heads are supported for Llama-layout targets (Llama, Qwen2/2.5, Qwen3, Mistral, ...) "
            "and Qwen3.5 / Qwen3-Next. Use --speculative draft or ngram."
        )
    head = Eagle3Head.load(head_path)
    head.check_target(config.hidden_size, config.vocab_size, config.num_hidden_layers, target_name)
    head.to(runner.device, runner.dtype)
    proposer = Eagle3Proposer(head, model, token_limit)
    layers = head.aux_layers(config.num_hidden_layers)
    if hybrid:
        assert isinstance(model, HybridModel)
        runner.hidden_taps = HybridTaps(model, layers, proposer.file_step)
    else:
        runner.hidden_taps = HiddenTaps(layers, proposer.file_step)
    return proposer
