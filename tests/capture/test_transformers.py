"""A Hugging Face `transformers` GPT-2 (bench/backend.py's workload, smaller) captured whole:
one graph, no breaks, with `fullgraph=True`, equal to eager with backend "eager" and with
the default backend; in training mode the gradients match eager's too.

It exercises what the library does around the tensor work: decorators that read
`func.__code__`, configs with `__getattribute__`/`__setattr__` in Python, a dict subclass
registry keyed through the model, `torch.compiler.is_compiling()` checks, the mask helpers,
SDPA attention and a ModelOutput (an OrderedDict dataclass) as the result."""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers  # the `test` extra installs it: a missing one fails, it is not skipped

import ember
from ember.testing import CountingBackend, assert_same


def _gpt2(train: bool = False):
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = transformers.GPT2Config(
            n_layer=2,
            n_head=4,
            n_embd=64,
            vocab_size=512,
            n_positions=64,
            resid_pdrop=0.0,
            attn_pdrop=0.0,
            embd_pdrop=0.0,
        )
        torch.manual_seed(0)
        model = transformers.GPT2Model(cfg)
    model.train(train)

    def run(ids):
        return model(input_ids=ids, use_cache=False).last_hidden_state

    ids = torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(1))
    return model, run, ids


@pytest.mark.parametrize("backend", ["eager", "ember"])
def test_gpt2_inference_is_one_graph(backend):
    _, run, ids = _gpt2()
    counter = CountingBackend(backend)
    compiled = ember.compile(run, backend=counter, fullgraph=True)
    with torch.no_grad():
        expected = run(ids)
        for _ in range(2):  # the second call takes the cache
            result = compiled(ids)
            if backend == "eager":
                assert torch.equal(result, expected)
            else:
                assert_same(result, expected, rtol=1e-4, atol=1e-5)
    assert counter.frame_count == 1


def test_gpt2_model_output_is_rebuilt():
    """The whole ModelOutput leaves the graph: same type, keys and attributes as eager."""
    model, _, ids = _gpt2()

    def run(ids):
        return model(input_ids=ids, use_cache=False)

    with torch.no_grad():
        expected = run(ids)
        result = ember.compile(run, backend="eager", fullgraph=True)(ids)
    assert type(result) is type(expected)
    assert list(result.keys()) == list(expected.keys())
    assert torch.equal(result.last_hidden_state, expected.last_hidden_state)
    assert torch.equal(result[0], expected[0])


@pytest.mark.parametrize("backend", ["eager", "ember"])
def test_gpt2_training_gradients(backend):
    model, run, ids = _gpt2(train=True)
    run(ids).square().mean().backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    counter = CountingBackend(backend)
    compiled = ember.compile(run, backend=counter, fullgraph=True)
    compiled(ids).square().mean().backward()
    assert counter.frame_count == 1
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, expected[name], rtol=1e-4, atol=1e-6, msg=name)
