"""Issue 12's real cases in transformers: BERT ran uncompiled (`apply_chunking_to_forward`
asks `inspect.signature` in forward; a validator looks types up in a dict keyed by typing
forms), and BERT/T5 training recompiled on every call (the loss module built in forward got
an identity guard). Tiny random configs, compared with eager and with Dynamo's capture."""

from __future__ import annotations

import warnings

import torch
import transformers
from fidelity_harness import check

import ember


def _quiet(make):
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        return make()


def _bert():
    cfg = transformers.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return transformers.BertForSequenceClassification(cfg)


def _inputs():
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, 100, (2, 8), generator=gen), torch.tensor([0, 1])


def test_bert_is_captured_whole():
    model = _quiet(_bert).eval()

    def run(ids, labels):
        out = model(input_ids=ids, labels=labels)
        return out.loss, out.logits

    counts = check(run, _inputs)
    assert counts.graphs == 1 and counts.breaks == 0


def test_bert_training_does_not_recompile_every_call():
    model = _quiet(_bert)
    compiled = ember.compile(model, backend="eager")
    for _ in range(4):
        ids, labels = _inputs()
        loss = compiled(input_ids=ids, labels=labels).loss
        loss.backward()
        expected = model(input_ids=ids, labels=labels).loss
        torch.testing.assert_close(loss, expected)
    stats = ember.stats()
    # forward sets config.problem_type on its first call: one recompile, as under Dynamo
    assert stats["recompiles"] == 1 and stats["eager_frames"] == 0, stats


def _t5():
    cfg = transformers.T5Config(
        vocab_size=100,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=2,
        decoder_start_token_id=0,
        pad_token_id=0,
        dropout_rate=0.0,
    )
    return transformers.T5ForConditionalGeneration(cfg)


def test_t5_training_step_is_one_graph_as_under_dynamo():
    """T5 builds its loss module (with keywords) and its caches (deep-copying its config,
    deleting attributes of the copy) inside forward."""
    model = _quiet(_t5)

    def run(ids):
        return model(input_ids=ids, labels=ids).loss

    counts = check(run, lambda: (_inputs()[0],))
    assert counts.graphs == 1 and counts.breaks == 0
    compiled = ember.compile(model, backend="eager")
    for _ in range(3):
        ids = _inputs()[0]
        compiled(input_ids=ids, labels=ids).loss.backward()
    assert ember.stats()["recompiles"] == 0
