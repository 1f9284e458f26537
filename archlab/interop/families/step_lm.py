"""The causal-LM class transformers 5.24 lacks for Step-3.5 (``step``): it reads a step3p5 config as
``Step3p7TextConfig`` and builds its text stack as ``Step3p7TextModel``, without an LM head; its only class
with the head, ``Step3p7ForConditionalGeneration``, holds a vision tower beside it. ``causal_lm_class``
gives the LM-head wrapper, ``Step3p5ForCausalLM``: transformers' ``Step3p7TextModel`` as ``model`` and an
``lm_head`` Linear, the tensor names of the published checkpoints (``model.*``, ``lm_head.weight``). It
imports transformers when called, the one part of ``families`` that does."""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def causal_lm_class() -> type:
    """``Step3p5ForCausalLM``: transformers' ``Step3p7TextModel`` as ``model`` and an ``lm_head``, with
    ``generate`` (transformers 5.24 has no causal-LM class of its own for step3p5)."""
    import transformers
    from torch import nn
    from transformers.modeling_outputs import MoeCausalLMOutputWithPast
    from transformers.modeling_utils import slice_logits_to_keep
    from transformers.models.step3p7.modeling_step3p7 import Step3p7PreTrainedModel

    class Step3p5ForCausalLM(Step3p7PreTrainedModel, transformers.GenerationMixin):
        config_class = transformers.Step3p7TextConfig
        _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

        def __init__(self, config: Any):
            super().__init__(config)
            self.model = transformers.Step3p7TextModel(config)
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            self.post_init()

        def get_output_embeddings(self) -> nn.Module:
            return self.lm_head

        def forward(
            self,
            input_ids: Any = None,
            attention_mask: Any = None,
            position_ids: Any = None,
            cache: Any = None,
            inputs_embeds: Any = None,
            use_cache: Any = None,
            logits_to_keep: int = 0,
            **kwargs: Any,
        ) -> Any:
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                cache=cache,
                inputs_embeds=inputs_embeds,
                use_cache=use_cache,
                **kwargs,
            )
            logits = self.lm_head(slice_logits_to_keep(out.last_hidden_state, logits_to_keep))
            return MoeCausalLMOutputWithPast(logits=logits, cache=out.cache)

    return Step3p5ForCausalLM
